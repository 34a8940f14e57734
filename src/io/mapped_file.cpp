#include "io/mapped_file.h"

#include "io/mapped_read.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace mxserve::io {
namespace {

// Live mappings by start address -> (size, path), for read_strided (mapped_read.h).
struct MappingRegistry {
  std::mutex mu;
  std::map<const uint8_t*, std::pair<uint64_t, std::string>> live;
};
MappingRegistry& registry() {
  static MappingRegistry* r = new MappingRegistry();  // never destroyed: mappings may outlive static teardown
  return *r;
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return not_found(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return internal_error(path + ": fstat failed: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalid_argument(path + ": not a regular file");
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return internal_error(path + ": mmap of " + std::to_string(f->size_) + " bytes failed: " + std::strerror(err));
    }
    f->data_ = static_cast<const uint8_t*>(p);
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live[f->data_] = {f->size_, path};
  }
  ::close(fd);
  return f;
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.erase(data_);
  }
  ::munmap(const_cast<uint8_t*>(data_), size_);
}

void read_strided(void* dst, const void* src, uint64_t chunk, uint64_t stride, uint64_t n_chunks) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  std::string path;
  uint64_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(registry().mu);
    auto it = registry().live.upper_bound(s);
    if (it != registry().live.begin()) {
      --it;
      const uint64_t end = (n_chunks == 0 ? 0 : (n_chunks - 1) * stride + chunk);
      if (s >= it->first && static_cast<uint64_t>(s - it->first) + end <= it->second.first) {
        path = it->second.second;
        offset = static_cast<uint64_t>(s - it->first);
      }
    }
  }
  bool done = false;
  if (!path.empty()) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      done = true;
      for (uint64_t i = 0; i < n_chunks && done; ++i) {
        uint64_t got = 0;
        while (got < chunk) {
          const ssize_t n = ::pread(fd, d + i * chunk + got, chunk - got, static_cast<off_t>(offset + i * stride + got));
          if (n <= 0) break;
          got += static_cast<uint64_t>(n);
        }
        done = got == chunk;
      }
      ::close(fd);
    }
  }
  if (done) return;
  for (uint64_t i = 0; i < n_chunks; ++i) std::memcpy(d + i * chunk, s + i * stride, chunk);
}

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open: " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return internal_error(path + ": read failed");
  return ss.str();
}

}  // namespace mxserve::io
