// Runs the fake OpenAI server on 127.0.0.1 for manual CLI runs:
//   mxserve_bench_fake_server_main [ttft_ms] [gap_ms] [seconds] [port]
// Prints the port, serves for `seconds` (default 60), then exits. Simulates an LRU prefix cache
// (16-word blocks, 200k words) so shared-prefix runs report cached_tokens.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "fake_openai_server.h"

using namespace mxserve::bench::testing;

int main(int argc, char** argv) {
  const double ttft = argc > 1 ? std::atof(argv[1]) / 1e3 : 0.05;
  const double gap = argc > 2 ? std::atof(argv[2]) / 1e3 : 0.005;
  const int seconds = argc > 3 ? std::atoi(argv[3]) : 60;
  const int port = argc > 4 ? std::atoi(argv[4]) : 0;
  LruPrefixCache cache(16, 200000 / 16);
  FakeOpenAiServer server([&](const FakeRequest& r) {
    FakePlan p;
    p.ttft_s = ttft;
    p.gap_s = gap;
    p.cached_tokens = cache.lookup_insert(r.prompt);
    return p;
  });
  if (!server.start(port)) return 1;
  std::printf("%d\n", server.port());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  return 0;
}
