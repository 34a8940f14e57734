// LoadRunner event loop (see load_runner.h). NOTE: one thread on purpose: with 2 cores shared with
// the server under test, a second client thread only adds wake-up jitter to the timestamps.
#include "bench/load_runner.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>

#include "bench/openai_stream.h"
#include "core/logging.h"

namespace mxserve::bench {

int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();
constexpr size_t kMaxErrorBody = 512;

void raise_fd_limit() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

class Runner;

struct Transfer {
  Runner* runner = nullptr;
  CURL* easy = nullptr;
  RequestRecord rec;
  std::string body;
  std::string error_body;
  std::unique_ptr<OpenAiStreamReader> reader;
  char errbuf[CURL_ERROR_SIZE] = {0};
};

class Runner {
 public:
  Runner(const HttpTarget& t, const LoadPlan& p, const BodySource& s, const RunOptions& o)
      : target_(t), plan_(p), source_(s), opt_(o) {}
  ~Runner() {
    for (auto& [easy, tr] : live_) {
      curl_multi_remove_handle(multi_, easy);
      curl_easy_cleanup(easy);
    }
    if (multi_) curl_multi_cleanup(multi_);
    if (headers_) curl_slist_free_all(headers_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  Result<RunResult> run();

  double now_s() const { return static_cast<double>(monotonic_ns() - start_ns_) * 1e-9; }
  void on_probe(int64_t server_ns, double client_now_s) {
    result_.probe_error_s.push_back(client_now_s - static_cast<double>(server_ns - start_ns_) * 1e-9);
  }

 private:
  static int socket_cb(CURL*, curl_socket_t s, int what, void* userp, void*) {
    auto* r = static_cast<Runner*>(userp);
    if (what == CURL_POLL_REMOVE) {
      epoll_ctl(r->epoll_fd_, EPOLL_CTL_DEL, s, nullptr);
      return 0;
    }
    epoll_event ev{};
    ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
    ev.data.fd = s;
    if (epoll_ctl(r->epoll_fd_, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
      epoll_ctl(r->epoll_fd_, EPOLL_CTL_ADD, s, &ev);
    return 0;
  }
  static int timer_cb(CURLM*, long timeout_ms, void* userp) {
    auto* r = static_cast<Runner*>(userp);
    r->curl_deadline_s_ = timeout_ms < 0 ? kNever : r->now_s() + static_cast<double>(timeout_ms) * 1e-3;
    return 0;
  }
  static size_t write_cb(char* p, size_t size, size_t n, void* ud) {
    auto* t = static_cast<Transfer*>(ud);
    const double now = t->runner->now_s();
    const size_t len = size * n;
    if (t->rec.http_status == 0) {
      long code = 0;
      curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
      t->rec.http_status = static_cast<int>(code);
    }
    if (t->rec.http_status == 200) {
      t->reader->feed(p, len, now);
    } else if (t->error_body.size() < kMaxErrorBody) {
      t->error_body.append(p, std::min(len, kMaxErrorBody - t->error_body.size()));
    }
    return len;
  }
  static void probe_cb(void* ctx, int64_t server_ns, double client_now_s) {
    static_cast<Runner*>(ctx)->on_probe(server_ns, client_now_s);
  }

  Status start_request(int64_t index, double scheduled_s);
  void drain_messages();
  void finish(CURL* easy, CURLcode code);
  void socket_action(curl_socket_t fd, int mask) {
    int running = 0;
    curl_multi_socket_action(multi_, fd, mask, &running);
  }
  void report_progress(double now);

  const HttpTarget& target_;
  const LoadPlan& plan_;
  const BodySource& source_;
  const RunOptions& opt_;
  CURLM* multi_ = nullptr;
  curl_slist* headers_ = nullptr;
  int epoll_fd_ = -1;
  int64_t start_ns_ = 0;
  double curl_deadline_s_ = kNever;
  std::unordered_map<CURL*, std::unique_ptr<Transfer>> live_;
  RunResult result_;
  int64_t sent_ = 0, done_ = 0, failed_ = 0;
  std::vector<double> ttfts_;
  double last_completion_s_ = 0;
};

Status Runner::start_request(int64_t index, double scheduled_s) {
  MX_ASSIGN_OR_RETURN(RequestSpec spec, source_(index));
  auto t = std::make_unique<Transfer>();
  t->runner = this;
  t->body = std::move(spec.body);
  t->rec.index = index;
  t->rec.warmup = index < plan_.warmup;
  t->rec.group = spec.group;
  t->rec.intended_input = spec.intended_input;
  t->rec.intended_output = spec.intended_output;
  t->rec.scheduled_s = scheduled_s;
  t->reader = std::make_unique<OpenAiStreamReader>(&t->rec);
  if (opt_.timing_probe) t->reader->set_probe(&Runner::probe_cb, this);
  CURL* e = curl_easy_init();
  if (!e) return internal_error("curl_easy_init failed");
  t->easy = e;
  curl_easy_setopt(e, CURLOPT_URL, target_.url.c_str());
  curl_easy_setopt(e, CURLOPT_POST, 1L);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, t->body.data());
  curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(t->body.size()));
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers_);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &Runner::write_cb);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->errbuf);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(e, CURLOPT_HTTP_VERSION, CURL_HTTP_VERSION_1_1);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(target_.request_timeout_s * 1000));
  curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
  t->rec.sent_s = now_s();
  if (!plan_.offsets.empty() && plan_.max_concurrency == 0) result_.send_lag_s.push_back(t->rec.sent_s - scheduled_s);
  CURLMcode mc = curl_multi_add_handle(multi_, e);
  if (mc != CURLM_OK) {
    curl_easy_cleanup(e);
    return internal_error(std::string("curl_multi_add_handle: ") + curl_multi_strerror(mc));
  }
  live_.emplace(e, std::move(t));
  ++sent_;
  result_.max_in_flight = std::max<int64_t>(result_.max_in_flight, static_cast<int64_t>(live_.size()));
  return Status::ok();
}

void Runner::finish(CURL* easy, CURLcode code) {
  auto it = live_.find(easy);
  if (it == live_.end()) return;
  std::unique_ptr<Transfer> t = std::move(it->second);
  live_.erase(it);
  curl_multi_remove_handle(multi_, easy);
  RequestRecord& r = t->rec;
  r.end_s = now_s();
  if (r.http_status == 0) {
    long http = 0;
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &http);
    r.http_status = static_cast<int>(http);
  }
  if (code == CURLE_OPERATION_TIMEDOUT) {
    r.error = "timeout after " + std::to_string(target_.request_timeout_s) + " s";
  } else if (code != CURLE_OK) {
    r.error = std::string("transport: ") + (t->errbuf[0] ? t->errbuf : curl_easy_strerror(code));
  } else if (r.http_status != 200) {
    r.error = "http " + std::to_string(r.http_status) + ": " + t->error_body.substr(0, 200);
  } else if (r.error.empty() && r.token_chunks == 0) {
    r.error = "no tokens in response";
  }
  if (code != CURLE_OK && r.error.empty()) r.error = curl_easy_strerror(code);
  r.ok = r.error.empty();
  curl_easy_cleanup(easy);
  ++done_;
  if (!r.ok) ++failed_;
  if (r.ok && !r.warmup) ttfts_.push_back(r.ttft());
  last_completion_s_ = r.end_s;
  result_.records.push_back(std::move(r));
}

void Runner::drain_messages() {
  int left = 0;
  while (CURLMsg* m = curl_multi_info_read(multi_, &left)) {
    if (m->msg == CURLMSG_DONE) finish(m->easy_handle, m->data.result);
  }
}

void Runner::report_progress(double now) {
  if (!opt_.progress) return;
  Progress p;
  p.elapsed_s = now;
  p.sent = sent_;
  p.done = done_;
  p.failed = failed_;
  p.in_flight = static_cast<int64_t>(live_.size());
  if (!ttfts_.empty()) {
    std::vector<double> v = ttfts_;
    size_t k = static_cast<size_t>(std::ceil(0.95 * static_cast<double>(v.size()))) - 1;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
    p.ttft_p95_s = v[k];
  }
  opt_.progress(p);
}

Result<RunResult> Runner::run() {
  const bool open_loop = !plan_.offsets.empty();
  if (!open_loop && plan_.max_concurrency <= 0) return invalid_argument("closed loop needs --max-concurrency > 0");
  if (!open_loop && plan_.num_requests < 0 && plan_.duration_s <= 0)
    return invalid_argument("closed loop needs --num-requests or --duration");
  raise_fd_limit();
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return internal_error(std::string("epoll_create1: ") + std::strerror(errno));
  multi_ = curl_multi_init();
  if (!multi_) return internal_error("curl_multi_init failed");
  curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, &Runner::socket_cb);
  curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
  curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, &Runner::timer_cb);
  curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
  curl_multi_setopt(multi_, CURLMOPT_MAXCONNECTS, 100000L);
  headers_ = curl_slist_append(headers_, "Content-Type: application/json");
  headers_ = curl_slist_append(headers_, "Accept: text/event-stream");
  headers_ = curl_slist_append(headers_, "Expect:");
  for (const std::string& h : target_.headers) headers_ = curl_slist_append(headers_, h.c_str());

  const int64_t n_open = static_cast<int64_t>(plan_.offsets.size());
  int64_t next = 0;
  start_ns_ = monotonic_ns();
  double next_progress = opt_.progress_interval_s;
  std::vector<epoll_event> events(1024);
  while (true) {
    double now = now_s();
    bool started = false;
    if (open_loop) {
      while (next < n_open && plan_.offsets[next] <= now &&
             (plan_.max_concurrency == 0 || static_cast<int64_t>(live_.size()) < plan_.max_concurrency)) {
        MX_RETURN_IF_ERROR(start_request(next, plan_.offsets[next]));
        ++next;
        started = true;
      }
    } else {
      while (static_cast<int64_t>(live_.size()) < plan_.max_concurrency &&
             (plan_.num_requests < 0 || next < plan_.num_requests) &&
             (plan_.duration_s <= 0 || now < plan_.duration_s)) {
        MX_RETURN_IF_ERROR(start_request(next, now));
        ++next;
        started = true;
      }
    }
    if (started) {
      socket_action(CURL_SOCKET_TIMEOUT, 0);
      drain_messages();
    }
    const bool all_issued = open_loop ? next >= n_open
                                      : ((plan_.num_requests >= 0 && next >= plan_.num_requests) ||
                                         (plan_.duration_s > 0 && now_s() >= plan_.duration_s));
    if (all_issued && live_.empty()) break;

    now = now_s();
    if (now >= next_progress) {
      report_progress(now);
      next_progress = now + opt_.progress_interval_s;
    }
    double deadline = std::min(curl_deadline_s_, next_progress);
    if (open_loop && next < n_open &&
        (plan_.max_concurrency == 0 || static_cast<int64_t>(live_.size()) < plan_.max_concurrency))
      deadline = std::min(deadline, plan_.offsets[next]);
    if (!open_loop && !all_issued && plan_.duration_s > 0) deadline = std::min(deadline, plan_.duration_s);
    if (deadline > now) {
      // NOTE: epoll_pwait2's nanosecond timeout replaces a timerfd: re-arming a timerfd on every
      // loop turn cost ~10% of the client's CPU at 50k events/s (it is a syscall per wake-up).
      timespec ts{};
      timespec* tsp = nullptr;
      if (std::isfinite(deadline)) {
        const int64_t wait_ns = static_cast<int64_t>((deadline - now) * 1e9) + 1;
        ts.tv_sec = wait_ns / 1'000'000'000;
        ts.tv_nsec = wait_ns % 1'000'000'000;
        tsp = &ts;
      }
      const int n = epoll_pwait2(epoll_fd_, events.data(), static_cast<int>(events.size()), tsp, nullptr);
      if (n < 0 && errno != EINTR) return internal_error(std::string("epoll_pwait2: ") + std::strerror(errno));
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        int mask = 0;
        if (events[i].events & EPOLLIN) mask |= CURL_CSELECT_IN;
        if (events[i].events & EPOLLOUT) mask |= CURL_CSELECT_OUT;
        if (events[i].events & (EPOLLERR | EPOLLHUP)) mask |= CURL_CSELECT_ERR;
        socket_action(fd, mask);
      }
    }
    if (now_s() >= curl_deadline_s_) {
      curl_deadline_s_ = kNever;
      socket_action(CURL_SOCKET_TIMEOUT, 0);
    }
    drain_messages();
  }
  report_progress(now_s());
  result_.wall_s = last_completion_s_;
  std::sort(result_.records.begin(), result_.records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  return std::move(result_);
}

}  // namespace

Result<RunResult> run_load(const HttpTarget& target, const LoadPlan& plan, const BodySource& source,
                           const RunOptions& options) {
  static const bool curl_ok = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  if (!curl_ok) return internal_error("curl_global_init failed");
  Runner r(target, plan, source, options);
  return r.run();
}

}  // namespace mxserve::bench
