// parallel/fused_path.h: which all-reduce + add + RMSNorm a launch runs -- fused by default at tp > 1 on CUDA
// (the peer kernel across GPUs, the event-ordered collective on the shared-device stand-in), off on the CPU
// backend unless asked, off with a reason at tp 1 / several nodes / too many ranks, errors where it is asked for
// and cannot run, and the opt-outs (--disable-custom-all-reduce, MXSERVE_FUSED_ALLREDUCE=0).
#include <gtest/gtest.h>

#include "parallel/fused_path.h"

namespace mxserve::parallel {
namespace {

FusedAllReduceRequest cuda_tp(int tp, bool shared_device = false) {
  FusedAllReduceRequest r;
  r.backend = "cuda";
  r.tp = tp;
  r.shared_device = shared_device;
  return r;
}

bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(FusedPath, DefaultOnCudaAtTpAboveOne) {
  auto peer = choose_fused_allreduce(cuda_tp(2));
  ASSERT_TRUE(peer.is_ok()) << peer.status().to_string();
  EXPECT_EQ(peer->kind, FusedAllReduceKind::kPeer);
  EXPECT_FALSE(peer->required);
  auto standin = choose_fused_allreduce(cuda_tp(4, /*shared_device=*/true));
  ASSERT_TRUE(standin.is_ok());
  EXPECT_EQ(standin->kind, FusedAllReduceKind::kEventOrdered);
  const std::string line = describe_fused_allreduce(*standin, 4, 2);
  EXPECT_TRUE(mentions(line, "tp 4 (2 group(s))")) << line;
  EXPECT_TRUE(mentions(line, "event-ordered")) << line;
  EXPECT_TRUE(mentions(line, "--disable-custom-all-reduce")) << line;
  auto eight = choose_fused_allreduce(cuda_tp(kFusedMaxRanks));
  ASSERT_TRUE(eight.is_ok());
  EXPECT_EQ(eight->kind, FusedAllReduceKind::kPeer);
}

TEST(FusedPath, OffWithAReason) {
  auto one = choose_fused_allreduce(cuda_tp(1));
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(one->kind, FusedAllReduceKind::kOff);
  FusedAllReduceRequest cpu;
  cpu.tp = 2;
  auto c = choose_fused_allreduce(cpu);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->kind, FusedAllReduceKind::kOff);
  EXPECT_TRUE(mentions(c->why, "--backend cpu")) << c->why;
  auto many = choose_fused_allreduce(cuda_tp(kFusedMaxRanks * 2));
  ASSERT_TRUE(many.is_ok());
  EXPECT_EQ(many->kind, FusedAllReduceKind::kOff);
  EXPECT_TRUE(mentions(many->why, "--tensor-parallel-size 16")) << many->why;
  FusedAllReduceRequest nodes = cuda_tp(2);
  nodes.multinode = true;
  auto n = choose_fused_allreduce(nodes);
  ASSERT_TRUE(n.is_ok());
  EXPECT_EQ(n->kind, FusedAllReduceKind::kOff);
  EXPECT_TRUE(mentions(n->why, "--nnodes")) << n->why;
}

TEST(FusedPath, OptOuts) {
  FusedAllReduceRequest flag = cuda_tp(2);
  flag.config_off = true;
  auto f = choose_fused_allreduce(flag);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->kind, FusedAllReduceKind::kOff);
  EXPECT_EQ(f->why, "--disable-custom-all-reduce");
  FusedAllReduceRequest env = cuda_tp(2, true);
  env.env = "0";
  auto e = choose_fused_allreduce(env);
  ASSERT_TRUE(e.is_ok());
  EXPECT_EQ(e->kind, FusedAllReduceKind::kOff);
  EXPECT_EQ(e->why, "--disable-custom-all-reduce / MXSERVE_FUSED_ALLREDUCE=0");
}

TEST(FusedPath, AskedForIsRequiredOrAnError) {
  FusedAllReduceRequest cpu;
  cpu.tp = 2;
  cpu.env = "1";
  auto ref = choose_fused_allreduce(cpu);
  ASSERT_TRUE(ref.is_ok());
  EXPECT_EQ(ref->kind, FusedAllReduceKind::kReference);
  EXPECT_TRUE(ref->required);
  FusedAllReduceRequest asked = cuda_tp(2);
  asked.config_on = true;
  auto a = choose_fused_allreduce(asked);
  ASSERT_TRUE(a.is_ok());
  EXPECT_TRUE(a->required);
  EXPECT_EQ(a->kind, FusedAllReduceKind::kPeer);
  asked.multinode = true;  // asked for where it cannot run: an error, not a silent fallback
  auto m = choose_fused_allreduce(asked);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnsupported);
  EXPECT_TRUE(mentions(m.status().message(), "--nnodes")) << m.status().to_string();
  FusedAllReduceRequest both = cuda_tp(2);
  both.env = "1";
  both.config_off = true;
  auto b = choose_fused_allreduce(both);
  ASSERT_FALSE(b.is_ok());
  EXPECT_TRUE(mentions(b.status().message(), "MXSERVE_FUSED_ALLREDUCE=1")) << b.status().to_string();
  EXPECT_TRUE(mentions(b.status().message(), "--disable-custom-all-reduce")) << b.status().to_string();
  FusedAllReduceRequest bad = cuda_tp(2);
  bad.env = "yes";
  auto v = choose_fused_allreduce(bad);
  ASSERT_FALSE(v.is_ok());
  EXPECT_TRUE(mentions(v.status().message(), "MXSERVE_FUSED_ALLREDUCE=yes")) << v.status().to_string();
  FusedAllReduceRequest one = cuda_tp(1);  // tp 1 asked: nothing to fuse, not an error
  one.config_on = true;
  auto o = choose_fused_allreduce(one);
  ASSERT_TRUE(o.is_ok());
  EXPECT_EQ(o->kind, FusedAllReduceKind::kOff);
}

}  // namespace
}  // namespace mxserve::parallel
