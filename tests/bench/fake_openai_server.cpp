// FakeOpenAiServer (see fake_openai_server.h).
#include "fake_openai_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "bench/token_codec.h"

namespace mxserve::bench::testing {
namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}
std::atomic<uint64_t> g_gen{0};  // connection generations: unique across servers

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

}  // namespace

struct FakeOpenAiServer::Conn {
  int fd = -1;
  std::string in, out;
  bool want_write = false;
  bool streaming = false;
  uint64_t gen = 0;
  FakePlan plan;
  bool chat = true;
  int64_t tokens = 0, sent = 0;
  int64_t next_ns = 0;
  int64_t prompt_words = 0;
};

FakeOpenAiServer::FakeOpenAiServer(FakeScript script) : script_(std::move(script)) {}
FakeOpenAiServer::~FakeOpenAiServer() { stop(); }

bool FakeOpenAiServer::start(int port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return false;
  int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
  if (listen(listen_fd_, 4096) != 0) return false;
  socklen_t len = sizeof addr;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  stop_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  for (int fd : {listen_fd_, stop_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  }
  thread_ = std::thread([this] { loop(); });
  return true;
}

double FakeOpenAiServer::thread_cpu_seconds() {
  if (!thread_.joinable()) return 0;
  clockid_t cid;
  if (pthread_getcpuclockid(thread_.native_handle(), &cid) != 0) return 0;
  timespec ts;
  clock_gettime(cid, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void FakeOpenAiServer::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t r = write(stop_fd_, &one, sizeof one);
    thread_.join();
  }
  for (auto& [fd, c] : conns_) {
    close(fd);
    delete c;
  }
  conns_.clear();
  for (int* fd : {&listen_fd_, &epoll_fd_, &stop_fd_})
    if (*fd >= 0) { close(*fd); *fd = -1; }
}

void FakeOpenAiServer::loop() {
  std::vector<epoll_event> events(512);
  while (true) {
    timespec ts{};
    timespec* tsp = nullptr;
    if (!heap_.empty()) {
      const int64_t wait_ns = std::max<int64_t>(0, heap_.front().at_ns - batch_window_ns - now_ns());
      ts.tv_sec = wait_ns / 1'000'000'000;
      ts.tv_nsec = wait_ns % 1'000'000'000;
      tsp = &ts;
    }
    const int n = epoll_pwait2(epoll_fd_, events.data(), static_cast<int>(events.size()), tsp, nullptr);
    if (n < 0 && errno != EINTR) return;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == stop_fd_) return;
      if (fd == listen_fd_) {
        while (true) {
          const int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (cfd < 0) break;
          int one = 1;
          setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          auto* c = new Conn();
          c->fd = cfd;
          conns_[cfd] = c;
          epoll_event ev{};
          ev.events = EPOLLIN;
          ev.data.fd = cfd;
          epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, cfd, &ev);
        }
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      if (events[i].events & EPOLLOUT) flush(c);
      if (conns_.count(fd) && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(c);
    }
    const int64_t now = now_ns() + batch_window_ns;
    while (!heap_.empty() && heap_.front().at_ns <= now) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<Due>());
      const Due d = heap_.back();
      heap_.pop_back();
      auto it = conns_.find(d.fd);
      if (it != conns_.end() && it->second->gen == d.gen && it->second->streaming) send_next_event(*it->second);
    }
  }
}

void FakeOpenAiServer::close_conn(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  close(fd);
  delete it->second;
  conns_.erase(it);
}

void FakeOpenAiServer::flush(Conn& c) {
  while (!c.out.empty()) {
    const ssize_t w = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(c.fd);
      return;
    }
    c.out.erase(0, static_cast<size_t>(w));
  }
  const bool want = !c.out.empty();
  if (want != c.want_write) {
    c.want_write = want;
    epoll_event ev{};
    ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
    ev.data.fd = c.fd;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
  }
}

void FakeOpenAiServer::write_out(Conn& c, const std::string& data) {
  c.out += data;
}

void FakeOpenAiServer::on_readable(Conn& c) {
  char buf[65536];
  const int fd = c.fd;
  while (true) {
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0) { close_conn(fd); return; }
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      close_conn(fd);
      return;
    }
    c.in.append(buf, static_cast<size_t>(r));
  }
  while (!c.streaming) {
    const size_t hdr_end = c.in.find("\r\n\r\n");
    if (hdr_end == std::string::npos) return;
    const std::string head = c.in.substr(0, hdr_end);
    size_t content_length = 0;
    size_t pos = head.find("\r\n");
    const std::string request_line = head.substr(0, pos);
    while (pos != std::string::npos && pos < head.size()) {
      const size_t next = head.find("\r\n", pos + 2);
      const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos && lower(line.substr(0, colon)) == "content-length")
        content_length = std::strtoull(line.c_str() + colon + 1, nullptr, 10);
      pos = next;
    }
    if (c.in.size() < hdr_end + 4 + content_length) return;
    const std::string body = c.in.substr(hdr_end + 4, content_length);
    c.in.erase(0, hdr_end + 4 + content_length);
    const size_t sp1 = request_line.find(' ');
    const size_t sp2 = request_line.find(' ', sp1 + 1);
    handle_request(c, request_line.substr(0, sp1), request_line.substr(sp1 + 1, sp2 - sp1 - 1), body);
    if (!conns_.count(fd)) return;
  }
}

void FakeOpenAiServer::handle_request(Conn& c, const std::string& method, const std::string& path,
                                      const std::string& body) {
  auto respond = [&](int status, const std::string& json) {
    write_out(c, "HTTP/1.1 " + std::to_string(status) + (status == 200 ? " OK" : " Error") +
                     "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(json.size()) +
                     "\r\n\r\n" + json);
    flush(c);
  };
  if (method == "GET" && path == "/health" && health_503_count >= 0) {
    const int64_t n = health_probes.fetch_add(1);
    respond(n < health_503_count ? 503 : 200, "{}");
    return;
  }
  if (method == "GET" && path == "/v1/models") {
    respond(200, R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
    return;
  }
  if (method == "GET" && path == "/metrics" && metrics_text) {
    const std::string text = metrics_text();
    write_out(c, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(text.size()) +
                     "\r\n\r\n" + text);
    flush(c);
    return;
  }
  if (method != "POST" || (path != "/v1/chat/completions" && path != "/v1/completions")) {
    respond(404, R"({"error":{"message":"not found","type":"not_found","code":404}})");
    return;
  }
  FakeRequest req;
  req.seq = requests_.fetch_add(1);
  req.path = path;
  req.arrival_ns = now_ns();
  req.body = nlohmann::json::parse(body, nullptr, false);
  if (!req.body.is_object()) {
    respond(400, R"({"error":{"message":"bad json","type":"invalid_request_error","code":400}})");
    return;
  }
  const bool chat = path == "/v1/chat/completions";
  if (chat && req.body.contains("messages") && req.body["messages"].is_array() && !req.body["messages"].empty()) {
    const auto& last = req.body["messages"].back();
    if (last.contains("content") && last["content"].is_string()) req.prompt = last["content"].get<std::string>();
  } else if (!chat && req.body.contains("prompt") && req.body["prompt"].is_string()) {
    req.prompt = req.body["prompt"].get<std::string>();
  }
  if (req.body.contains("max_tokens") && req.body["max_tokens"].is_number_integer())
    req.max_tokens = req.body["max_tokens"].get<int64_t>();
  FakePlan plan = script_(req);
  if (plan.status != 200) {
    respond(plan.status, R"({"error":{"message":"scripted failure","type":"server_error","code":)" +
                             std::to_string(plan.status) + "}}");
    return;
  }
  c.plan = std::move(plan);
  c.chat = chat;
  c.tokens = !c.plan.texts.empty() ? static_cast<int64_t>(c.plan.texts.size())
                                    : c.plan.tokens >= 0 ? c.plan.tokens : req.max_tokens;
  c.sent = 0;
  c.streaming = true;
  c.gen = ++g_gen;
  c.prompt_words = static_cast<int64_t>(split_words(req.prompt).size());
  write_out(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
  std::string first;
  if (!c.plan.comment.empty()) first += ": " + c.plan.comment + "\n\n";
  if (chat && c.plan.empty_role_chunk)
    first += R"(data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]})" "\n\n";
  if (!first.empty()) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "%zx\r\n", first.size());
    write_out(c, hex + first + "\r\n");
  }
  flush(c);
  if (!conns_.count(c.fd)) return;
  c.next_ns = req.arrival_ns + static_cast<int64_t>(c.plan.ttft_s * 1e9);
  heap_.push_back({c.next_ns, c.fd, c.gen});
  std::push_heap(heap_.begin(), heap_.end(), std::greater<Due>());
}

void FakeOpenAiServer::send_next_event(Conn& c) {
  // NOTE: formatted into one stack buffer and sent directly when nothing is queued: at 100k
  // events/s the fake server shares the machine with the client it is measuring.
  char buf[1024];
  const int64_t k = c.sent++;
  const bool last = c.sent >= c.tokens;
  char stamp[48] = "";
  if (c.plan.stamp) std::snprintf(stamp, sizeof stamp, ",\"mx_t\":%lld", static_cast<long long>(now_ns()));
  const char* finish = last ? "\"length\"" : "null";
  int n = c.chat ? std::snprintf(buf + 16, sizeof buf - 16,
                                 "data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":"
                                 "{\"content\":\"t%lld \"},\"finish_reason\":%s}]%s}\n\n",
                                 static_cast<long long>(k), finish, stamp)
                 : std::snprintf(buf + 16, sizeof buf - 16,
                                 "data: {\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"t%lld \","
                                 "\"finish_reason\":%s}]%s}\n\n",
                                 static_cast<long long>(k), finish, stamp);
  std::string ev(buf + 16, static_cast<size_t>(n));
  if (!c.plan.texts.empty()) {  // scripted content: the same event with the text in place of "t<k> "
    const std::string text = nlohmann::json(c.plan.texts[static_cast<size_t>(k)]).dump();
    const std::string placeholder = "\"t" + std::to_string(k) + " \"";
    ev.replace(ev.find(placeholder), placeholder.size(), text);
  }
  bool end = last;
  if (c.plan.error_after_first && k == 0) {
    ev += "data: {\"error\":{\"message\":\"scripted mid-stream failure\",\"type\":\"server_error\",\"code\":500}}\n\n";
    end = true;
  } else if (last && c.plan.usage) {
    const int64_t pt = c.plan.prompt_tokens >= 0 ? c.plan.prompt_tokens : c.prompt_words;
    const int64_t ct = c.plan.completion_tokens >= 0 ? c.plan.completion_tokens : c.tokens;
    ev += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":" + std::to_string(pt) +
          ",\"completion_tokens\":" + std::to_string(ct) + ",\"total_tokens\":" + std::to_string(pt + ct);
    if (c.plan.cached_tokens >= 0)
      ev += ",\"prompt_tokens_details\":{\"cached_tokens\":" + std::to_string(c.plan.cached_tokens) + "}";
    ev += "}}\n\n";
  }
  if (end) ev += "data: [DONE]\n\n";
  char hex[32];
  const int hn = std::snprintf(hex, sizeof hex, "%zx\r\n", ev.size());
  if (!end && c.out.empty() && c.plan.texts.empty() && ev.size() + static_cast<size_t>(hn) + 2 + 16 <= sizeof buf) {
    // Fast path: frame in place and send with one syscall.
    char* start = buf + 16 - hn;
    std::memcpy(start, hex, static_cast<size_t>(hn));
    std::memcpy(buf + 16 + ev.size(), "\r\n", 2);
    const size_t len = static_cast<size_t>(hn) + ev.size() + 2;
    const ssize_t w = ::send(c.fd, start, len, MSG_NOSIGNAL);
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      close_conn(c.fd);
      return;
    }
    if (w < static_cast<ssize_t>(len)) c.out.append(start + std::max<ssize_t>(w, 0), len - static_cast<size_t>(std::max<ssize_t>(w, 0)));
  } else {
    write_out(c, std::string(hex, static_cast<size_t>(hn)) + ev + "\r\n" + (end ? "0\r\n\r\n" : ""));
  }
  if (end) {
    c.streaming = false;
  } else {
    const double gap = static_cast<size_t>(k) < c.plan.gaps_s.size() ? c.plan.gaps_s[static_cast<size_t>(k)] : c.plan.gap_s;
    c.next_ns += static_cast<int64_t>(gap * 1e9);
    heap_.push_back({c.next_ns, c.fd, c.gen});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<Due>());
  }
  const int fd = c.fd;
  if (!c.out.empty()) flush(c);
  if (end && conns_.count(fd) && !c.in.empty()) on_readable(c);
}

int64_t LruPrefixCache::lookup_insert(const std::string& prompt) {
  const std::vector<std::string_view> words = split_words(prompt);
  uint64_t h = 1469598103934665603ull;
  int64_t cached = 0;
  bool hitting = true;
  const int64_t full_blocks = static_cast<int64_t>(words.size()) / block_;
  for (int64_t b = 0; b < full_blocks; ++b) {
    for (int64_t i = b * block_; i < (b + 1) * block_; ++i) {
      for (char ch : words[static_cast<size_t>(i)]) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
      h = (h ^ 0x20) * 1099511628211ull;
    }
    auto it = map_.find(h);
    if (it != map_.end()) {
      if (hitting) cached += block_;
      lru_.splice(lru_.begin(), lru_, it->second);
    } else {
      hitting = false;
      lru_.push_front(h);
      map_[h] = lru_.begin();
      if (static_cast<int64_t>(lru_.size()) > capacity_) {
        map_.erase(lru_.back());
        lru_.pop_back();
      }
    }
  }
  return cached;
}

}  // namespace mxserve::bench::testing
