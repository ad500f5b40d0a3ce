#include "scheduler/declaration_table.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/common/dtype.h"

namespace cortado::scheduler {

DeclarationTable::DeclarationTable(int numWorkers) : numWorkers_(numWorkers) {}

std::string DeclarationTable::describe(const control::TensorDecl& d) {
  return fmt::format("{} x {}, codec {}{}{}", dtypeName(d.dtype), d.numElements,
                     d.codec.empty() ? "none" : "'" + d.codec + "'",
                     d.codec.empty() ? ""
                     : d.errorFeedback ? " with error feedback"
                                       : " without error feedback",
                     d.contributors == 0 ? std::string()
                                         : fmt::format(", {} pushes per round", d.contributors));
}

std::string DeclarationTable::label(const control::TensorDecl& d) {
  if (d.incarnation == 0) return fmt::format("'{}'", d.name);
  return fmt::format("'{}' (declaration {}, after a release)", d.name, uint64_t(d.incarnation) + 1);
}

std::optional<std::string> DeclarationTable::labelOfKey(uint64_t key) const {
  auto it = labels_.find(key);
  if (it == labels_.end()) return std::nullopt;
  return it->second;
}

DeclarationTable::Outcome DeclarationTable::declare(int worker, const control::TensorDecl& decl) {
  Outcome out;
  Entry& e = entries_[{decl.name, decl.incarnation}];
  if (e.byWorker.empty()) e.byWorker.resize(numWorkers_);
  auto& mine = e.byWorker[worker];
  if (mine) {
    if (!(*mine == decl)) {
      out.kind = Outcome::Kind::kRejected;
      out.status = Status(ErrorCode::kInvalidArgument,
                          fmt::format("worker {} declared tensor {} again with different values: "
                                      "first {}, now {}; a tensor keeps its declaration",
                                      worker, label(decl), describe(*mine), describe(decl)));
      return out;
    }
    out.kind = e.agreed ? Outcome::Kind::kAgreed : Outcome::Kind::kPending;
    out.key = e.key.value_or(0);
    return out;
  }
  mine = decl;
  ++e.count;
  if (worker == 0) {
    e.key = nextKey_++;
    labels_[*e.key] = label(decl);
  }
  for (const auto& other : e.byWorker) {
    if (other && !(*other == decl)) {
      out.kind = Outcome::Kind::kMismatch;
      out.status = mismatch(decl, e);
      return out;
    }
  }
  if (e.count == numWorkers_) {
    e.agreed = true;
    ++numAgreed_;
    out.kind = Outcome::Kind::kAgreed;
    out.key = *e.key;
  }
  return out;
}

std::string DeclarationTable::describePending(const std::string& name, uint32_t incarnation,
                                              int worker) const {
  auto it = entries_.find({name, incarnation});
  if (it == entries_.end() || worker < 0 || worker >= numWorkers_ || !it->second.byWorker[worker])
    return {};
  std::vector<int> missing;
  for (int w = 0; w < numWorkers_; ++w)
    if (!it->second.byWorker[w]) missing.push_back(w);
  const auto& d = *it->second.byWorker[worker];
  return fmt::format("{} ({}), which {} {} {} not declared", label(d), describe(d),
                     missing.size() == 1 ? "worker" : "workers", fmt::join(missing, ", "),
                     missing.size() == 1 ? "has" : "have");
}

Status DeclarationTable::mismatch(const control::TensorDecl& latest, const Entry& e) const {
  // Group the workers by what they declared, in order of first appearance.
  std::vector<std::pair<control::TensorDecl, std::vector<int>>> groups;
  for (int w = 0; w < numWorkers_; ++w) {
    if (!e.byWorker[w]) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == *e.byWorker[w]; });
    if (it == groups.end()) {
      groups.push_back({*e.byWorker[w], {w}});
    } else {
      it->second.push_back(w);
    }
  }
  std::vector<std::string> fields;
  const auto& first = groups.front().first;
  auto differs = [&](auto get) {
    for (const auto& g : groups)
      if (!(get(g.first) == get(first))) return true;
    return false;
  };
  if (differs([](const control::TensorDecl& d) { return d.dtype; })) fields.push_back("dtype");
  if (differs([](const control::TensorDecl& d) { return d.numElements; }))
    fields.push_back("numElements");
  if (differs([](const control::TensorDecl& d) { return d.codec; })) fields.push_back("codec");
  if (differs([](const control::TensorDecl& d) { return d.errorFeedback; }))
    fields.push_back("errorFeedback");
  if (differs([](const control::TensorDecl& d) { return d.contributors; }))
    fields.push_back("contributors");
  std::vector<std::string> parts;
  for (const auto& [decl, workers] : groups) {
    parts.push_back(fmt::format("{} {} declared {}", workers.size() == 1 ? "worker" : "workers",
                                fmt::join(workers, ", "), describe(decl)));
  }
  return Status(ErrorCode::kMismatch,
                fmt::format("declaration mismatch for tensor {} ({} differ{}): {}", label(latest),
                            fmt::join(fields, ", "), fields.size() == 1 ? "s" : "",
                            fmt::join(parts, "; ")));
}

}  // namespace cortado::scheduler
