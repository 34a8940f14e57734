// mxserve_echo_server: the EchoServer (echo_server.h) as a process, for client tests in other languages
// (tests/server/openai_tool_calls_test.mjs). Usage: mxserve_echo_server TEMPLATE_NAME API_KEY
// Prints "listening on port N" on stdout once serving; exits when stdin closes.
#include <cstdio>
#include <iostream>
#include <string>

#include "echo_server.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: mxserve_echo_server TEMPLATE_NAME API_KEY\n");
    return 2;
  }
  mxserve::server::testing::EchoServerOptions o;
  o.template_name = argv[1];
  o.api_key = argv[2];
  mxserve::server::testing::EchoServer server(o);
  std::printf("listening on port %d\n", server.port());
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  return 0;
}
