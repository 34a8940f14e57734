#include "http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <mutex>

namespace mxserve::server::testing {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t on_body(char* p, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(p, size * n);
  return size * n;
}

size_t on_header(char* p, size_t size, size_t n, void* user) {
  auto* h = static_cast<std::map<std::string, std::string>*>(user);
  std::string line(p, size * n);
  const auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ')) value.erase(value.begin());
    while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) value.pop_back();
    (*h)[name] = value;
  }
  return size * n;
}

struct SseSink {
  SseResult* result;
  int hang_up_after;
  std::string buffer;
};

size_t on_sse(char* p, size_t size, size_t n, void* user) {
  auto* s = static_cast<SseSink*>(user);
  s->result->raw.append(p, size * n);
  s->buffer.append(p, size * n);
  size_t pos;
  while ((pos = s->buffer.find("\n\n")) != std::string::npos) {
    const std::string event = s->buffer.substr(0, pos);
    s->buffer.erase(0, pos + 2);
    if (event.rfind("data: ", 0) == 0) s->result->events.push_back(event.substr(6));
    if (s->hang_up_after >= 0 && static_cast<int>(s->result->events.size()) >= s->hang_up_after) return 0;
  }
  return size * n;
}

CURL* make(const std::string& method, const std::string& url, const std::string& body,
           const std::vector<std::string>& headers, curl_slist** list, long timeout_ms) {
  global_init();
  CURL* c = curl_easy_init();
  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  if (method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  } else if (method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  *list = curl_slist_append(nullptr, "Expect:");  // no 100-continue round trip
  for (const auto& h : headers) *list = curl_slist_append(*list, h.c_str());
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, *list);
  return c;
}

}  // namespace

HttpResult http_request(const std::string& method, const std::string& url, const std::string& body,
                        const std::vector<std::string>& headers, long timeout_ms) {
  HttpResult r;
  curl_slist* list = nullptr;
  CURL* c = make(method, url, body, headers, &list, timeout_ms);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
  r.curl_code = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(c);
  return r;
}

SseResult http_stream(const std::string& url, const std::string& body, const std::vector<std::string>& headers,
                      int hang_up_after, long timeout_ms) {
  SseResult r;
  SseSink sink{&r, hang_up_after, {}};
  curl_slist* list = nullptr;
  CURL* c = make("POST", url, body, headers, &list, timeout_ms);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_sse);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
  r.curl_code = curl_easy_perform(c);
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(c);
  return r;
}

}  // namespace mxserve::server::testing
