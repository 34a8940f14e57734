#include "bench/http_get.h"

#include <curl/curl.h>

namespace mxserve::bench {
namespace {
size_t collect(char* p, size_t s, size_t n, void* ud) {
  auto* out = static_cast<std::string*>(ud);
  if (out->size() < (32u << 20)) out->append(p, s * n);  // control responses are small: cap at 32 MiB
  return s * n;
}
}  // namespace

Result<HttpGetResult> http_get(const std::string& url, const std::string& api_key, long timeout_ms) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURL* e = curl_easy_init();
  if (!e) return internal_error("curl_easy_init failed");
  HttpGetResult out;
  curl_slist* headers = nullptr;
  if (!api_key.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + api_key).c_str());
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &collect);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &out.body);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  const CURLcode rc = curl_easy_perform(e);
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &out.status);
  curl_easy_cleanup(e);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) return unavailable("GET " + url + ": " + curl_easy_strerror(rc));
  return out;
}

}  // namespace mxserve::bench
