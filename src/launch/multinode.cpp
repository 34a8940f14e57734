#include "launch/multinode.h"
#include "launch/rank_graphs.h"

#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/device_oom.h"
#include "core/logging.h"
#include "launch/launch.h"
#include "launch/step_codec.h"
#include "parallel/gloo_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/tcp_link.h"

namespace mxserve::launch {
namespace {

using parallel::kForever;
using parallel::LinkClock;
constexpr const char* kPayloadTag = "mxserve-multinode 1";
// How long node 0 waits for a follower's load (a big checkpoint takes minutes); a follower that dies is seen
// at once (its link closes), this bounds only a follower that hangs.
constexpr std::chrono::minutes kLoadWait{30};

parallel::DistInit& dist_slot() {
  static parallel::DistInit d;
  return d;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

}  // namespace

void set_process_dist_init(const parallel::DistInit& d) { dist_slot() = d; }
const parallel::DistInit& process_dist_init() { return dist_slot(); }

class NodeSession {
 public:
  parallel::DistInit dist;
  std::chrono::milliseconds timeout{0};
  int ranks_per_node = 1;
  int link_port = 0;
  std::string nccl_id;    // raw bytes (CUDA launches)
  std::string bind_host;  // this node's address as the other nodes reach it
  // node 0
  parallel::TcpListener listener;
  parallel::KvStoreServer store;
  std::vector<parallel::TcpConn> followers;  // [node - 1]
  std::vector<std::string> fingerprints;     // [node - 1], from their hello
  std::thread acceptor;
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable cv;
  // a follower
  parallel::TcpConn leader_link;

  bool leader() const { return dist.node_rank == 0; }
  std::string node_name(int node) const {
    return "node " + std::to_string(node) + " (ranks " + std::to_string(node * ranks_per_node) + ".." +
           std::to_string((node + 1) * ranks_per_node - 1) + ")";
  }
  // Node 0: the followers whose links are closed.
  std::string dead_nodes() {
    std::string out;
    for (size_t i = 0; i < followers.size(); ++i)
      if (followers[i].peer_closed()) out += (out.empty() ? "" : ", ") + node_name(static_cast<int>(i) + 1);
    return out;
  }
  // Node 0: the frame to every follower; the first failure names the node.
  Status send_all(const std::string& frame) {
    for (size_t i = 0; i < followers.size(); ++i) {
      Status s = followers[i].send_frame(frame, LinkClock::now() + timeout);
      if (!s.is_ok()) return s.with_context(node_name(static_cast<int>(i) + 1) + " is gone");
    }
    return Status::ok();
  }

  ~NodeSession() {
    stop = true;
    if (acceptor.joinable()) acceptor.join();
    store.stop();
  }

  void accept_loop() {
    while (!stop) {
      auto conn = listener.accept(LinkClock::now() + std::chrono::milliseconds(200), "a node");
      if (!conn.is_ok()) continue;
      auto hello = conn->recv_frame(LinkClock::now() + std::chrono::seconds(10));
      if (!hello.is_ok()) continue;
      if (*hello == "KV") {
        store.serve(std::move(*conn));
        continue;
      }
      std::istringstream in(*hello);
      std::string word;
      int node = -1;
      in >> word >> node;
      std::string fp;
      std::getline(in, fp);
      if (word != "NODE" || node < 1 || node >= dist.nnodes) continue;
      std::lock_guard<std::mutex> lock(mutex);
      conn->set_peer(node_name(node));
      followers[node - 1] = std::move(*conn);
      fingerprints[node - 1] = fp.empty() ? fp : fp.substr(1);
      cv.notify_all();
    }
  }
};

void NodeSessionDeleter::operator()(NodeSession* s) const { delete s; }

const parallel::DistInit& session_dist(const NodeSession& s) { return s.dist; }

// "code: message" (Status::to_string) back into a Status; unknown codes are internal errors.
static Status status_from_text(const std::string& text) {
  for (StatusCode c : {StatusCode::kInvalidArgument, StatusCode::kNotFound, StatusCode::kDataLoss,
                       StatusCode::kUnsupported, StatusCode::kOutOfMemory, StatusCode::kInternal,
                       StatusCode::kUnavailable}) {
    const std::string prefix = std::string(status_code_name(c)) + ": ";
    if (text.rfind(prefix, 0) == 0) return Status(c, text.substr(prefix.size()));
  }
  return internal_error(text);
}

std::string describe_node(const NodeSession& s) {
  return s.node_name(s.dist.node_rank) + " of " + std::to_string(s.dist.nnodes) + " nodes";
}

Result<std::vector<parallel::RankLayout>> node_ranks(const std::vector<parallel::RankLayout>& world,
                                                     const parallel::ParallelConfig& p, const parallel::DistInit& d) {
  const int n = static_cast<int>(world.size());
  if (d.nnodes <= 1) return world;
  if (p.dp > 1)
    return unsupported("--nnodes " + std::to_string(d.nnodes) + " with --data-parallel-size " + std::to_string(p.dp) +
                       ": data parallelism across nodes is not implemented yet (tensor / expert parallelism span "
                       "nodes; docs/parallel.md)");
  if (n % d.nnodes != 0)
    return invalid_argument("--tensor-parallel-size " + std::to_string(p.tp) + " x --data-parallel-size " +
                            std::to_string(p.dp) + " = " + std::to_string(n) + " ranks do not spread evenly over --nnodes " +
                            std::to_string(d.nnodes));
  const int per = n / d.nnodes;
  std::vector<parallel::RankLayout> local;
  for (int i = 0; i < per; ++i) {
    parallel::RankLayout l = world[d.node_rank * per + i];
    l.device = p.first_device + i;
    local.push_back(l);
  }
  return local;
}

Result<NodeSessionPtr> start_node_session(const parallel::DistInit& d, bool cuda,
                                                        std::chrono::milliseconds timeout, int ranks_per_node,
                                                        const std::string& fingerprint) {
  NodeSessionPtr s(new NodeSession());
  s->dist = d;
  s->timeout = timeout;
  s->ranks_per_node = ranks_per_node;
  parallel::RendezvousOptions ro;
  ro.timeout = timeout;
  const auto deadline = LinkClock::now() + timeout;
  if (s->leader()) {
    if (cuda) {
      MX_ASSIGN_OR_RETURN(parallel::NcclId id, parallel::make_nccl_unique_id());
      s->nccl_id.assign(id.data(), id.size());
    }
    MX_ASSIGN_OR_RETURN(s->listener, parallel::TcpListener::listen_any(0));
    s->link_port = s->listener.port();
    s->bind_host = d.host;
    s->followers.resize(d.nnodes - 1);
    s->fingerprints.resize(d.nnodes - 1);
    s->acceptor = std::thread([p = s.get()] { p->accept_loop(); });
    const std::string payload = std::string(kPayloadTag) + " " + std::to_string(s->link_port) + " " +
                                (s->nccl_id.empty() ? "-" : hex(s->nccl_id));
    MX_RETURN_IF_ERROR(parallel::rendezvous_share(d, payload, ro).status());
    // Every follower's step link, then its fingerprint against ours.
    std::unique_lock<std::mutex> lock(s->mutex);
    const bool all = s->cv.wait_until(lock, deadline, [&] {
      for (auto& f : s->followers)
        if (!f.open()) return false;
      return true;
    });
    Status verdict = Status::ok();
    if (!all) {
      std::string missing;
      for (size_t i = 0; i < s->followers.size(); ++i)
        if (!s->followers[i].open()) missing += (missing.empty() ? "" : ", ") + s->node_name(static_cast<int>(i) + 1);
      verdict = unavailable("multi-node start-up: " + missing + " passed the rendezvous but never opened its step link");
    }
    for (size_t i = 0; verdict.is_ok() && i < s->fingerprints.size(); ++i)
      if (s->fingerprints[i] != fingerprint)
        verdict = invalid_argument("multi-node start-up: " + s->node_name(static_cast<int>(i) + 1) + " was started as [" +
                                   s->fingerprints[i] + "], node 0 as [" + fingerprint +
                                   "]: every node runs the same command but --node-rank");
    for (auto& f : s->followers)
      if (f.open()) (void)f.send_frame(verdict.is_ok() ? "ACK" : "FAIL " + verdict.message(), deadline);
    if (!verdict.is_ok()) return verdict;
    return s;
  }
  MX_ASSIGN_OR_RETURN(std::string payload, parallel::rendezvous_share(d, "", ro));
  std::istringstream in(payload);
  std::string a, b, id;
  int port = 0;
  in >> a >> b >> port >> id;
  if (a + " " + b != kPayloadTag || port <= 0)
    return data_loss("multi-node start-up: node 0 sent '" + payload.substr(0, 64) + "' (another mxserve version?)");
  if (id != "-") s->nccl_id = unhex(id);
  s->link_port = port;
  MX_ASSIGN_OR_RETURN(s->leader_link, parallel::tcp_connect(d.host, port, deadline, "node 0"));
  MX_RETURN_IF_ERROR(s->leader_link.send_frame("NODE " + std::to_string(d.node_rank) + " " + fingerprint, deadline));
  MX_ASSIGN_OR_RETURN(std::string verdict, s->leader_link.recv_frame(deadline));
  if (verdict != "ACK") return unavailable("node 0 stopped the launch: " + verdict.substr(verdict.find(' ') + 1));
  s->bind_host = s->leader_link.local_host();
  return s;
}

Result<std::vector<std::unique_ptr<parallel::Communicator>>> node_communicators(
    NodeSession& s, const std::vector<parallel::RankLayout>& local, const std::vector<backend::Backend*>& backends,
    bool cuda, std::chrono::milliseconds timeout) {
  if (cuda) {
    if (s.nccl_id.size() != sizeof(parallel::NcclId)) return data_loss("multi-node start-up: node 0 sent no NCCL id");
    parallel::NcclId id;
    std::copy(s.nccl_id.begin(), s.nccl_id.end(), id.begin());
    parallel::NcclOptions no;
    no.timeout = timeout;
    return parallel::make_nccl_communicators(local, backends, &id, no);
  }
  parallel::GlooOptions go;
  go.timeout = timeout;
  go.store_host = s.dist.host;
  go.store_port = s.link_port;
  go.bind_host = s.bind_host;
  go.ranks_per_node = s.ranks_per_node;
  return parallel::make_gloo_communicators(local, go);
}

Status node_handshake(NodeSession& s, const Status& local) {
  const auto deadline = LinkClock::now() + kLoadWait;
  if (!s.leader()) {
    const std::string me = s.node_name(s.dist.node_rank);
    MX_RETURN_IF_ERROR(s.leader_link.send_frame(local.is_ok() ? "READY" : "FAIL " + me + " failed at start-up: " +
                                                                        local.message(), deadline));
    if (!local.is_ok()) return local;
    auto got = s.leader_link.recv_frame(deadline);
    if (!got.is_ok()) return got.status().with_context(me + " loaded; waiting for node 0's go-ahead");
    const std::string& verdict = *got;
    if (verdict != "GO") return unavailable("the multi-node launch stopped: " + verdict.substr(verdict.find(' ') + 1));
    return Status::ok();
  }
  Status verdict = local.is_ok() ? Status::ok() : local.with_context("node 0 failed at start-up");
  for (size_t i = 0; verdict.is_ok() && i < s.followers.size(); ++i) {
    auto r = s.followers[i].recv_frame(deadline);
    if (!r.is_ok()) verdict = r.status().with_context("multi-node start-up");
    else if (*r != "READY") verdict = unavailable(r->substr(r->find(' ') + 1));
  }
  (void)s.send_all(verdict.is_ok() ? "GO" : "FAIL " + verdict.message());
  return verdict;
}

namespace {

// Node 0's model: each call goes to every follower first, then runs on this node's ranks.
class LeaderModel final : public model::CausalLM {
 public:
  LeaderModel(NodeSession& s, model::CausalLM& local, backend::Backend& be, std::vector<parallel::Communicator*> comms)
      : s_(s), local_(local), be_(be), comms_(std::move(comms)) {
    watchdog_ = std::thread([this] { watch(); });
  }
  ~LeaderModel() override {
    {
      std::lock_guard<std::mutex> lock(watch_mutex_);
      stop_watch_ = true;
    }
    watch_cv_.notify_all();
    watchdog_.join();
    (void)s_.send_all(encode_step(StepKind::kQuit, {}, nullptr, nullptr, nullptr, nullptr));
  }

  const model::ModelConfig& config() const override { return local_.config(); }
  kvcache::KvCacheSpec kv_spec(int64_t n_blocks, int64_t block_size) const override {
    return local_.kv_spec(n_blocks, block_size);
  }
  bool has_mtp() const override { return local_.has_mtp(); }

  Result<model::ForwardOutput> forward(const model::ForwardBatch& batch, kvcache::KvCache& kv) override {
    MX_RETURN_IF_ERROR(send(StepKind::kForward, kv, &batch, nullptr, nullptr, nullptr));
    try {
      return check(local_.forward(batch, kv));
    } catch (const DeviceOutOfMemory& oom) {  // a one-rank node: the group must still hear of it (fail)
      return check(out_of_memory(oom.what()));
    }
  }
  Result<model::ForwardOutput> forward_mtp(const model::ForwardBatch& batch, const Tensor& hidden_in,
                                           kvcache::KvCache& kv) override {
    const Tensor host = be_.to_host(hidden_in);
    MX_RETURN_IF_ERROR(send(StepKind::kForwardMtp, kv, &batch, &host, nullptr, nullptr));
    try {
      return check(local_.forward_mtp(batch, hidden_in, kv));
    } catch (const DeviceOutOfMemory& oom) {
      return check(out_of_memory(oom.what()));
    }
  }
  // Decode graphs: refused (the engine logs it and runs every step eagerly).
  Status forward_device(const Tensor&, const Tensor&, const backend::AttentionMeta&, kvcache::KvCache&, Tensor&,
                        Tensor*) override {
    return unsupported(multinode_graphs_refusal());
  }
  void copy_kv_slots(backend::Backend& be, const Tensor& src, const Tensor& dst, kvcache::KvCache& kv) override {
    const Tensor hs = be.to_host(src), hd = be.to_host(dst);
    Status st = send(StepKind::kCopyKvSlots, kv, nullptr, nullptr, &hs, &hd);
    if (st.is_ok()) local_.copy_kv_slots(be, src, dst, kv);
  }

 private:
  Status send(StepKind kind, kvcache::KvCache& kv, const model::ForwardBatch* batch, const Tensor* hidden,
              const Tensor* src, const Tensor* dst) {
    if (!failed_.is_ok()) return failed_;
    StepCache c;
    const kvcache::KvCacheSpec& spec = kv.spec();
    c.n_blocks = spec.n_blocks;
    c.block_size = spec.block_size;
    if (const kvcache::BlockTableStore* t = kv.block_tables()) {
      c.table_rows = t->max_rows();
      c.table_max_blocks = t->max_blocks_per_seq();
    }
    auto it = caches_.find(&kv);
    if (it == caches_.end() || it->second.n_blocks != c.n_blocks || it->second.block_size != c.block_size) {
      c.drop_id = it == caches_.end() ? 0 : it->second.id;
      c.id = ++next_id_;
      caches_[&kv] = c;
    } else {
      c.id = it->second.id;
    }
    Status s = s_.send_all(encode_step(kind, c, batch, hidden, src, dst));
    if (!s.is_ok()) fail(s);
    return failed_;
  }

  Result<model::ForwardOutput> check(Result<model::ForwardOutput> r) {
    if (r.is_ok()) return r;
    fail(r.status());
    return failed_;
  }

  // The group is failed for good: the other nodes' ranks are told (our communicators abort), the culprit
  // named, and the process stops shortly after answering this call (a failed rank group cannot recover).
  void fail(const Status& why) {
    if (!failed_.is_ok()) return;
    for (parallel::Communicator* c : comms_) c->abort(why);
    // A follower whose own step failed says why on its step link before it aborts ("FAIL <status>"): that
    // error, not our collectives' echo of it, is what the client gets (within half a second).
    Status cause = why;
    const auto deadline = LinkClock::now() + std::chrono::milliseconds(500);
    for (auto& f : s_.followers) {
      if (!f.open()) continue;
      auto frame = f.recv_frame(deadline);
      if (frame.is_ok() && frame->rfind("FAIL ", 0) == 0) {
        cause = status_from_text(frame->substr(5));
        break;
      }
    }
    const std::string dead = s_.dead_nodes();
    failed_ = cause.with_context("the multi-node launch failed" + (dead.empty() ? "" : " (" + dead + " stopped)"));
    MX_LOG(kError) << failed_.message() << "; node 0 stops in 1 s (restart every node)";
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
  }

  // A follower never writes to its step link after start-up: a readable link means it closed (the node stopped).
  // Node 0 then stops too, idle or not, naming it (its ranks cannot recover).
  void watch() {
    std::unique_lock<std::mutex> lock(watch_mutex_);
    while (!watch_cv_.wait_for(lock, std::chrono::milliseconds(250), [&] { return stop_watch_; })) {
      const std::string dead = s_.dead_nodes();
      if (dead.empty()) continue;
      MX_LOG(kError) << "the multi-node launch failed: " << dead << " stopped (its step link closed); node 0 stops "
                     << "(restart every node)";
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // an in-flight call may still report it
      std::_Exit(1);
    }
  }

  NodeSession& s_;
  model::CausalLM& local_;
  backend::Backend& be_;
  std::vector<parallel::Communicator*> comms_;
  std::map<const kvcache::KvCache*, StepCache> caches_;
  uint64_t next_id_ = 0;
  Status failed_ = Status::ok();
  std::mutex watch_mutex_;
  std::condition_variable watch_cv_;
  bool stop_watch_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<model::CausalLM> make_leader_model(NodeSession& session, model::CausalLM& local, backend::Backend& be,
                                                   std::vector<parallel::Communicator*> comms) {
  return std::make_unique<LeaderModel>(session, local, be, std::move(comms));
}

Status run_follower_node(LaunchedModel& lm) {
  NodeSession* s = lm.node_session();
  if (s == nullptr || s->leader()) return invalid_argument("run_follower_node: not a follower node of a multi-node launch");
  model::CausalLM& local = lm.local_model();
  backend::Backend& be = lm.backend();
  auto alloc = [&be](DType dt, Shape shape) { return be.alloc(dt, std::move(shape)); };
  std::map<uint64_t, std::unique_ptr<kvcache::KvCache>> caches;
  auto abort_all = [&](const Status& why) {
    for (int r = 0; r < lm.world(); ++r) lm.rank_communicator(r).abort(why);
    return why.with_context(describe_node(*s));
  };
  MX_LOG(kInfo) << describe_node(*s) << ": ready, running node 0's steps";
  for (uint64_t steps = 0;; ++steps) {
    auto frame = s->leader_link.recv_frame(kForever);
    if (!frame.is_ok())
      return abort_all(frame.status().with_context("node 0 stopped without saying so (after " + std::to_string(steps) +
                                                   " steps)"));
    MX_ASSIGN_OR_RETURN(auto msg, decode_step(*frame));
    if (msg->kind == StepKind::kQuit) {
      MX_LOG(kInfo) << describe_node(*s) << ": node 0 quit after " << steps << " steps";
      return Status::ok();
    }
    if (msg->cache.drop_id != 0) caches.erase(msg->cache.drop_id);
    std::unique_ptr<kvcache::KvCache>& kv = caches[msg->cache.id];
    if (!kv) kv = std::make_unique<kvcache::KvCache>(local.kv_spec(msg->cache.n_blocks, msg->cache.block_size), alloc);
    if (msg->cache.table_rows >= 0) {
      const kvcache::BlockTableStore* have = kv->block_tables();
      if (have == nullptr || have->max_rows() != msg->cache.table_rows ||
          have->max_blocks_per_seq() != msg->cache.table_max_blocks)
        kv->enable_block_tables(msg->cache.table_rows, msg->cache.table_max_blocks, alloc,
                                [&be](Tensor& dst, int64_t offset, const Tensor& host) { be.write_from_host(dst, offset, host); });
    }
    Status st = Status::ok();
    try {
      if (msg->kind == StepKind::kForward) {
        st = local.forward(msg->batch, *kv).status();
      } else if (msg->kind == StepKind::kForwardMtp) {
        st = local.forward_mtp(msg->batch, be.upload(msg->hidden_in), *kv).status();
      } else {
        local.copy_kv_slots(be, be.upload(msg->src_slots), be.upload(msg->dst_slots), *kv);
      }
    } catch (const DeviceOutOfMemory& oom) {  // core/device_oom.h: this node's device is full
      st = out_of_memory(oom.what());
    }
    if (!st.is_ok()) {  // node 0 reads it (LeaderModel::fail) before its collectives' echo of our abort
      const Status mine = st.with_context(describe_node(*s) + ", step " + std::to_string(steps));
      (void)s->leader_link.send_frame("FAIL " + mine.to_string(), LinkClock::now() + std::chrono::seconds(2));
      return abort_all(st.with_context("step " + std::to_string(steps)));
    }
  }
}

}  // namespace mxserve::launch
