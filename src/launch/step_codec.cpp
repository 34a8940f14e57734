#include "launch/step_codec.h"

#include <cstring>

namespace mxserve::launch {
namespace {

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void i64(int64_t v) { out_.append(reinterpret_cast<const char*>(&v), 8); }
  template <typename T>
  void vec(const std::vector<T>& v) {
    i64(static_cast<int64_t>(v.size()));
    out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void tensor(const Tensor* t) {
    if (t == nullptr || !t->defined() || t->raw() == nullptr) {
      i64(-1);
      return;
    }
    i64(static_cast<int64_t>(t->dtype()));
    vec(t->shape());
    out_.append(static_cast<const char*>(t->raw()), t->nbytes());
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  Status need(uint64_t n, const char* field) {
    if (pos_ + n > s_.size()) return data_loss(std::string("multi-node step message truncated at ") + field);
    return Status::ok();
  }
  Result<uint8_t> u8(const char* f) {
    MX_RETURN_IF_ERROR(need(1, f));
    return static_cast<uint8_t>(s_[pos_++]);
  }
  Result<int64_t> i64(const char* f) {
    MX_RETURN_IF_ERROR(need(8, f));
    int64_t v;
    std::memcpy(&v, s_.data() + pos_, 8);
    pos_ += 8;
    return v;
  }
  template <typename T>
  Status vec(std::vector<T>* v, const char* f) {
    MX_ASSIGN_OR_RETURN(int64_t n, i64(f));
    if (n < 0 || static_cast<uint64_t>(n) > s_.size()) return data_loss(std::string("multi-node step message: bad ") + f);
    MX_RETURN_IF_ERROR(need(n * sizeof(T), f));
    v->resize(n);
    std::memcpy(v->data(), s_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return Status::ok();
  }
  Result<Tensor> tensor(const char* f) {
    MX_ASSIGN_OR_RETURN(int64_t dt, i64(f));
    if (dt < 0) return Tensor();
    Shape shape;
    MX_RETURN_IF_ERROR(vec(&shape, f));
    Tensor t = Tensor::empty(static_cast<DType>(dt), shape);
    MX_RETURN_IF_ERROR(need(t.nbytes(), f));
    std::memcpy(t.raw(), s_.data() + pos_, t.nbytes());
    pos_ += t.nbytes();
    return t;
  }

 private:
  const std::string& s_;
  uint64_t pos_ = 0;
};

}  // namespace

std::string encode_step(StepKind kind, const StepCache& cache, const model::ForwardBatch* batch,
                        const Tensor* hidden_in, const Tensor* src_slots, const Tensor* dst_slots) {
  Writer w;
  w.u8(static_cast<uint8_t>(kind));
  for (int64_t v : {static_cast<int64_t>(cache.id), static_cast<int64_t>(cache.drop_id), cache.n_blocks,
                    cache.block_size, cache.table_rows, cache.table_max_blocks})
    w.i64(v);
  w.u8(batch != nullptr);
  if (batch != nullptr) {
    w.vec(batch->token_ids);
    w.vec(batch->positions);
    w.vec(batch->logit_rows);
    w.u8(batch->want_hidden);
    w.u8(batch->want_host_logits);
    w.vec(batch->mtp_step.first_step_rows);
    w.i64(static_cast<int64_t>(batch->seqs.size()));
    for (const model::SequenceSpan& s : batch->seqs) {
      for (int64_t v : {int64_t{s.token_begin}, int64_t{s.n_tokens}, int64_t{s.kv_len}, int64_t{s.table_row},
                        static_cast<int64_t>(s.table_lease), int64_t{s.tree_base}})
        w.i64(v);
      w.u8(s.host_table != nullptr);
      w.vec(s.blocks());
      w.vec(s.kv_indices);
      w.vec(s.tree_mask);
    }
  }
  w.tensor(hidden_in);
  w.tensor(src_slots);
  w.tensor(dst_slots);
  return w.take();
}

Result<std::unique_ptr<StepMessage>> decode_step(const std::string& bytes) {
  Reader r(bytes);
  auto m = std::make_unique<StepMessage>();
  MX_ASSIGN_OR_RETURN(uint8_t kind, r.u8("kind"));
  if (kind != 'F' && kind != 'M' && kind != 'C' && kind != 'Q')
    return data_loss("multi-node step message: unknown kind " + std::to_string(kind) + " (not mxserve, or another version?)");
  m->kind = static_cast<StepKind>(kind);
  int64_t c[6];
  for (int64_t& v : c) {
    MX_ASSIGN_OR_RETURN(v, r.i64("cache"));
  }
  m->cache = StepCache{static_cast<uint64_t>(c[0]), static_cast<uint64_t>(c[1]), c[2], c[3], c[4], c[5]};
  MX_ASSIGN_OR_RETURN(uint8_t has_batch, r.u8("batch"));
  if (has_batch) {
    model::ForwardBatch& b = m->batch;
    MX_RETURN_IF_ERROR(r.vec(&b.token_ids, "token_ids"));
    MX_RETURN_IF_ERROR(r.vec(&b.positions, "positions"));
    MX_RETURN_IF_ERROR(r.vec(&b.logit_rows, "logit_rows"));
    MX_ASSIGN_OR_RETURN(uint8_t want_hidden, r.u8("want_hidden"));
    MX_ASSIGN_OR_RETURN(uint8_t want_host_logits, r.u8("want_host_logits"));
    b.want_hidden = want_hidden != 0;
    b.want_host_logits = want_host_logits != 0;
    MX_RETURN_IF_ERROR(r.vec(&b.mtp_step.first_step_rows, "mtp_first_step_rows"));
    MX_ASSIGN_OR_RETURN(int64_t n_seqs, r.i64("seqs"));
    if (n_seqs < 0 || static_cast<uint64_t>(n_seqs) > bytes.size()) return data_loss("multi-node step message: bad seqs");
    b.seqs.resize(n_seqs);
    for (model::SequenceSpan& s : b.seqs) {
      int64_t v[6];
      for (int64_t& x : v) {
        MX_ASSIGN_OR_RETURN(x, r.i64("span"));
      }
      s.token_begin = static_cast<int32_t>(v[0]);
      s.n_tokens = static_cast<int32_t>(v[1]);
      s.kv_len = static_cast<int32_t>(v[2]);
      s.table_row = static_cast<int32_t>(v[3]);
      s.table_lease = static_cast<uint64_t>(v[4]);
      s.tree_base = static_cast<int32_t>(v[5]);
      MX_ASSIGN_OR_RETURN(uint8_t host, r.u8("host_table"));
      std::vector<int32_t> blocks;
      MX_RETURN_IF_ERROR(r.vec(&blocks, "block_table"));
      if (host) {
        m->host_tables.push_back(std::make_unique<std::vector<int32_t>>(std::move(blocks)));
        s.host_table = m->host_tables.back().get();
      } else {
        s.block_table = std::move(blocks);
      }
      MX_RETURN_IF_ERROR(r.vec(&s.kv_indices, "kv_indices"));
      MX_RETURN_IF_ERROR(r.vec(&s.tree_mask, "tree_mask"));
    }
  }
  MX_ASSIGN_OR_RETURN(m->hidden_in, r.tensor("hidden_in"));
  MX_ASSIGN_OR_RETURN(m->src_slots, r.tensor("src_slots"));
  MX_ASSIGN_OR_RETURN(m->dst_slots, r.tensor("dst_slots"));
  return m;
}

}  // namespace mxserve::launch
