// LockstepModel's recovery after a failed step (launch/lockstep_model.h "Recovery"): a step whose failed ranks
// all failed with kOutOfMemory leaves every rank alive, so once every worker has returned (run_each waited for
// them: no rank is inside a collective) the group is made healthy again -- every rank's stream synchronized
// (the aborted collectives' and the failed step's device work drained), then every communicator of every rank
// reset (parallel/recoverable.h) -- and the next step runs. Anything else breaks the group for good.
// Invariant: a job starts only on a healthy group (before_step); a recovery never runs while rank 0's stream is
// being captured (synchronizing a capturing stream is illegal), it then waits for the next job.
#include "core/logging.h"
#include "launch/lockstep_model.h"
#include "parallel/nccl_communicator.h"
#include "parallel/recoverable.h"

namespace mxserve::launch {

Status LockstepModel::after_failed_step(const Status& root, bool recoverable) {
  if (!broken_.is_ok()) return root;
  if (!recoverable || !no_recovery_.empty()) {
    broken_ = root.with_context(!recoverable ? "the rank group cannot recover (only from a device out-of-memory; "
                                               "restart the server)"
                                             : "the rank group cannot recover (" + no_recovery_ +
                                                   "; restart the server)");
    MX_LOG(kError) << broken_.to_string();
    return root;
  }
  pending_recovery_ = root;
  if (join_ && join_->root_capturing()) return root;  // recovered before the next job (before_step)
  const Status recovered = recover();
  (void)recovered;  // a failed recovery broke the group (logged); this step's error is the root cause
  return root;
}

Status LockstepModel::before_step() {
  if (!broken_.is_ok()) return Status(broken_.code(), "the rank group failed earlier: " + broken_.message());
  if (pending_recovery_.is_ok()) return Status::ok();
  if (join_ && join_->root_capturing())
    return unavailable("the rank group is recovering from a failed step (" + pending_recovery_.message() +
                       "): no capture until it has");
  return recover();
}

Status LockstepModel::recover() {
  const int restore = ranks_[0].cuda_device;
  for (const Rank& r : ranks_) {  // quiet point: run_each waited for every worker; drain every rank's stream
    if (r.cuda_device >= 0) parallel::bind_thread_to_device(r.cuda_device);
    r.backend->synchronize();
  }
  if (restore >= 0) parallel::bind_thread_to_device(restore);
  Status st = Status::ok();
  for (int r = 0; r < world() && st.is_ok(); ++r)
    for (parallel::Communicator* c : {ranks_[r].comm, ranks_[r].tp_comm}) {
      if (c == nullptr || !st.is_ok()) continue;
      auto* resettable = dynamic_cast<parallel::RecoverableGroup*>(c);
      st = resettable == nullptr ? unsupported("the " + c->name() + " communicator cannot reset after an abort")
                                 : resettable->reset_after_abort().with_context("rank " + std::to_string(r) + " (" +
                                                                                c->name() + ")");
    }
  if (restore >= 0) parallel::bind_thread_to_device(restore);  // NCCL's re-init switched devices on its threads
  if (!st.is_ok()) {
    broken_ = st.with_context("recovering the rank group after " + pending_recovery_.message() +
                              " (restart the server)");
    pending_recovery_ = Status::ok();
    MX_LOG(kError) << "lockstep: " << broken_.to_string();
    return broken_;
  }
  ++recoveries_;
  MX_LOG(kWarn) << "lockstep: the rank group of " << world() << " recovered after a failed step ("
                   << pending_recovery_.message() << "): every rank's stream synchronized and its communicators "
                   << "reset; the step's requests failed, later steps run (recovery " << recoveries_ << ")";
  pending_recovery_ = Status::ok();
  return Status::ok();
}

}  // namespace mxserve::launch
