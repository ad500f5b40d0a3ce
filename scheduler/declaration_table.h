// The scheduler's record of tensor declarations: it checks that every worker
// declares a tensor the same way and hands out one job-wide key per tensor.
//
// Keys: the n-th distinct name that worker 0 declares gets key n. That depends
// only on worker 0's program order, not on which worker's message arrives
// first, so a job declaring the same tensors gets the same keys on every run.
// A name declared again after its release (TensorDecl::incarnation) is a new
// tensor: it is agreed on afresh and gets the next key.
// Pure logic, touched only on the scheduler's io thread.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/common/error.h"
#include "core/control/control_client.h"

namespace cortado::scheduler {

class DeclarationTable {
 public:
  explicit DeclarationTable(int numWorkers);

  struct Outcome {
    enum class Kind {
      kPending,   // waiting for other workers' declarations
      kAgreed,    // every worker declared the same thing: `key`
      kRejected,  // this worker alone erred (declared a name again, differently): `status`
      kMismatch,  // the workers disagree: `status` (kMismatch) fails the job
    };
    Kind kind = Kind::kPending;
    uint64_t key = 0;
    Status status;
  };

  // `worker` must be in [0, numWorkers).
  Outcome declare(int worker, const control::TensorDecl& decl);

  size_t numAgreed() const { return numAgreed_; }

  // A declaration that some workers made and others have not, for the
  // scheduler's check of workers that all wait in declarations no one else
  // makes: "'a' (float32 x 336, codec none), which worker 1 has not
  // declared". Empty for a name and incarnation no worker declared.
  std::string describePending(const std::string& name, uint32_t incarnation, int worker) const;

  // The label (as label() writes it) of the tensor that has `key`, once
  // worker 0 declared it; nullopt for a key never handed out.
  std::optional<std::string> labelOfKey(uint64_t key) const;

  // "float32 x 1024, codec none"
  static std::string describe(const control::TensorDecl& d);
  // "'fc.weight'", or "'fc.weight' (declaration 2, after a release)"
  static std::string label(const control::TensorDecl& d);

 private:
  struct Entry {
    std::vector<std::optional<control::TensorDecl>> byWorker;
    int count = 0;
    std::optional<uint64_t> key;  // set when worker 0 declares it
    bool agreed = false;
  };

  Status mismatch(const control::TensorDecl& latest, const Entry& e) const;

  int numWorkers_;
  std::map<std::pair<std::string, uint32_t>, Entry> entries_;  // (name, incarnation)
  std::map<uint64_t, std::string> labels_;                     // key -> label()
  uint64_t nextKey_ = 0;
  size_t numAgreed_ = 0;
};

}  // namespace cortado::scheduler
