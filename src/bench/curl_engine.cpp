// CurlEngine: libcurl multi + socket callbacks + epoll (see http_engine.h).
#include <curl/curl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "bench/http_engine.h"

namespace mxserve::bench {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

struct CurlState {
  CURL* easy = nullptr;
  RunTracker* tracker = nullptr;
  char errbuf[CURL_ERROR_SIZE] = {0};
};

class CurlEngine final : public HttpEngine {
 public:
  explicit CurlEngine(RunTracker& tracker) : tracker_(tracker) {}
  ~CurlEngine() override {
    for (auto& [easy, t] : live_) {
      curl_multi_remove_handle(multi_, easy);
      curl_easy_cleanup(easy);
      delete static_cast<CurlState*>(t->engine_state);
    }
    if (multi_) curl_multi_cleanup(multi_);
    if (headers_) curl_slist_free_all(headers_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  Status init() {
    static const bool curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
    if (!curl_ok) return internal_error("curl_global_init failed");
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_fd_ < 0) return internal_error(std::string("epoll_create1: ") + std::strerror(errno));
    multi_ = curl_multi_init();
    if (!multi_) return internal_error("curl_multi_init failed");
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &CurlEngine::socket_cb);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &CurlEngine::timer_cb);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, 100000L);
    headers_ = curl_slist_append(headers_, "Content-Type: application/json");
    headers_ = curl_slist_append(headers_, "Accept: text/event-stream");
    headers_ = curl_slist_append(headers_, "Expect:");
    for (const std::string& h : tracker_.target().headers) headers_ = curl_slist_append(headers_, h.c_str());
    return Status::ok();
  }

  Status start(std::unique_ptr<Transfer> t) override {
    auto* st = new CurlState();
    CURL* e = curl_easy_init();
    if (!e) {
      delete st;
      return internal_error("curl_easy_init failed");
    }
    st->easy = e;
    st->tracker = &tracker_;
    t->engine_state = st;
    const HttpTarget& target = tracker_.target();
    curl_easy_setopt(e, CURLOPT_URL, target.url.c_str());
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.data());
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &CurlEngine::write_cb);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, st->errbuf);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(target.request_timeout_s * 1000));
    const CURLMcode mc = curl_multi_add_handle(multi_, e);
    if (mc != CURLM_OK) {
      curl_easy_cleanup(e);
      delete st;
      return internal_error(std::string("curl_multi_add_handle: ") + curl_multi_strerror(mc));
    }
    live_.emplace(e, std::move(t));
    socket_action(CURL_SOCKET_TIMEOUT, 0);
    drain();
    return Status::ok();
  }

  Status wait(double timeout_s) override {
    timespec ts{};
    timespec* tsp = nullptr;
    if (std::isfinite(timeout_s)) {
      const int64_t ns = static_cast<int64_t>(std::max(0.0, timeout_s) * 1e9) + 1;
      ts.tv_sec = ns / 1'000'000'000;
      ts.tv_nsec = ns % 1'000'000'000;
      tsp = &ts;
    }
    epoll_event events[512];
    const int n = epoll_pwait2(epoll_fd_, events, 512, tsp, nullptr);
    if (n < 0 && errno != EINTR) return internal_error(std::string("epoll_pwait2: ") + std::strerror(errno));
    for (int i = 0; i < n; ++i) {
      int mask = 0;
      if (events[i].events & EPOLLIN) mask |= CURL_CSELECT_IN;
      if (events[i].events & EPOLLOUT) mask |= CURL_CSELECT_OUT;
      if (events[i].events & (EPOLLERR | EPOLLHUP)) mask |= CURL_CSELECT_ERR;
      socket_action(events[i].data.fd, mask);
    }
    if (tracker_.now_s() >= curl_deadline_s_) {
      curl_deadline_s_ = kNever;
      socket_action(CURL_SOCKET_TIMEOUT, 0);
    }
    drain();
    return Status::ok();
  }

  double next_deadline() const override { return curl_deadline_s_; }
  int64_t in_flight() const override { return static_cast<int64_t>(live_.size()); }

 private:
  static int socket_cb(CURL*, curl_socket_t s, int what, void* userp, void*) {
    auto* self = static_cast<CurlEngine*>(userp);
    if (what == CURL_POLL_REMOVE) {
      epoll_ctl(self->epoll_fd_, EPOLL_CTL_DEL, s, nullptr);
      return 0;
    }
    epoll_event ev{};
    ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
    ev.data.fd = s;
    if (epoll_ctl(self->epoll_fd_, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
      epoll_ctl(self->epoll_fd_, EPOLL_CTL_ADD, s, &ev);
    return 0;
  }
  static int timer_cb(CURLM*, long timeout_ms, void* userp) {
    auto* self = static_cast<CurlEngine*>(userp);
    self->curl_deadline_s_ = timeout_ms < 0 ? kNever : self->tracker_.now_s() + static_cast<double>(timeout_ms) * 1e-3;
    return 0;
  }
  static size_t write_cb(char* p, size_t size, size_t n, void* ud) {
    auto* t = static_cast<Transfer*>(ud);
    auto* st = static_cast<CurlState*>(t->engine_state);
    const double now = st->tracker->now_s();
    if (t->rec.http_status == 0) {
      long code = 0;
      curl_easy_getinfo(st->easy, CURLINFO_RESPONSE_CODE, &code);
      t->rec.http_status = static_cast<int>(code);
    }
    t->on_body(p, size * n, now);
    return size * n;
  }
  void socket_action(curl_socket_t fd, int mask) {
    int running = 0;
    curl_multi_socket_action(multi_, fd, mask, &running);
  }
  void drain() {
    int left = 0;
    while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
      if (m->msg != CURLMSG_DONE) continue;
      CURL* easy = m->easy_handle;
      const CURLcode code = m->data.result;
      auto it = live_.find(easy);
      if (it == live_.end()) continue;
      std::unique_ptr<Transfer> t = std::move(it->second);
      live_.erase(it);
      auto* st = static_cast<CurlState*>(t->engine_state);
      curl_multi_remove_handle(multi_, easy);
      long http = 0;
      curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
      if (t->rec.http_status == 0) t->rec.http_status = static_cast<int>(http);
      std::string transport;
      if (code == CURLE_OPERATION_TIMEDOUT)
        transport = timeout_message(tracker_.target().request_timeout_s);
      else if (code != CURLE_OK)
        transport = std::string("transport: ") + (st->errbuf[0] ? st->errbuf : curl_easy_strerror(code));
      curl_easy_cleanup(easy);
      delete st;
      t->engine_state = nullptr;
      tracker_.finish(std::move(t), transport);
    }
  }

  RunTracker& tracker_;
  CURLM* multi_ = nullptr;
  curl_slist* headers_ = nullptr;
  int epoll_fd_ = -1;
  double curl_deadline_s_ = kNever;
  std::unordered_map<CURL*, std::unique_ptr<Transfer>> live_;
};

}  // namespace

Result<std::unique_ptr<HttpEngine>> make_curl_engine(RunTracker& tracker) {
  auto e = std::make_unique<CurlEngine>(tracker);
  MX_RETURN_IF_ERROR(e->init());
  return std::unique_ptr<HttpEngine>(std::move(e));
}

}  // namespace mxserve::bench
