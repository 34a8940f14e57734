#include "server/http/channel.h"

#include <sys/socket.h>

#include <cerrno>

namespace mxserve::server::http {
namespace {

constexpr size_t kKeepCapacity = 64 << 10;  // a drained buffer larger than this is released

}  // namespace

bool Channel::send(std::string_view bytes) {
  bool wake = false;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (client_gone()) return false;
    space_cv_.wait(lock, [&] { return client_gone() || out_.size() - offset_ < max_pending_; });
    if (client_gone()) return false;
    if (out_.size() == offset_) progress_at_ = Clock::now();
    out_.append(bytes);
    if (!wake_pending_) wake = wake_pending_ = true;
  }
  if (wake) waker_->wake_flush(id_);
  return true;
}

void Channel::append(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (out_.size() == offset_) progress_at_ = Clock::now();
  out_.append(bytes);
}

Channel::FlushResult Channel::flush(int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  wake_pending_ = false;
  FlushResult result = FlushResult::kDrained;
  while (offset_ < out_.size()) {
    const ssize_t n = ::send(fd, out_.data() + offset_, out_.size() - offset_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      offset_ += static_cast<size_t>(n);
      progress_at_ = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    result = (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) ? FlushResult::kPending : FlushResult::kError;
    break;
  }
  if (offset_ == out_.size()) {
    if (out_.capacity() > kKeepCapacity) std::string().swap(out_);
    else out_.clear();
    offset_ = 0;
  } else if (offset_ > out_.size() / 2) {
    out_.erase(0, offset_);
    offset_ = 0;
  }
  space_cv_.notify_all();
  return result;
}

size_t Channel::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return out_.size() - offset_;
}

Channel::Clock::time_point Channel::stalled_since() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return progress_at_;
}

void Channel::mark_gone() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gone_.store(true, std::memory_order_release);
    std::string().swap(out_);
    offset_ = 0;
  }
  space_cv_.notify_all();
}

}  // namespace mxserve::server::http
