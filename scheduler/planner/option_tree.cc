#include "scheduler/planner/option_tree.h"

#include <functional>
#include <utility>

namespace cortado::planner {
namespace {

using plan::CommOp;
using plan::Device;
using plan::Scope;
using plan::Step;
using plan::TensorOption;

using Cont = std::function<void()>;

struct Pair {
  CommOp first;
  CommOp second;
};
constexpr Pair kRawPairs[] = {{CommOp::kReduceScatter, CommOp::kAllgather},
                              {CommOp::kReduce, CommOp::kBroadcast}};
constexpr Pair kCompressedPairs[] = {{CommOp::kAlltoall, CommOp::kAllgather},
                                     {CommOp::kGather, CommOp::kBroadcast}};

// Walks the tree depth-first, pushing and popping steps on one vector; each
// leaf becomes an option. The T1..T5 names follow ESPRESSO.md §1.
class Builder {
 public:
  explicit Builder(const TreeConfig& c) : c_(c) {
    devices_.push_back(Device::kGpu);
    if (c.cpuCodecs) devices_.push_back(Device::kCpu);
  }

  std::vector<TensorOption> run() {
    if (c_.flat) {
      hier_ = false;
      flatRaw();
      if (c_.compression) flatCompressed();
    }
    if (c_.hierarchical) {
      hier_ = true;
      hierRaw();
      if (c_.compression) hierCompressed();
    }
    // Uncompressed options first: stable_partition keeps the tree order.
    std::vector<TensorOption> out;
    for (auto& o : out_)
      if (!o.compressed()) out.push_back(o);
    for (auto& o : out_)
      if (o.compressed()) out.push_back(std::move(o));
    return out;
  }

 private:
  void with(Step s, const Cont& k) {
    steps_.push_back(s);
    k();
    steps_.pop_back();
  }
  void comm(Scope s, CommOp op, bool compressed, const Cont& k) {
    with(Step::comm(s, op, compressed), k);
  }
  void encode(const std::function<void()>& k) {
    if (!c_.compression) return;
    for (Device d : devices_) with(Step::encode(d), k);
  }
  void decode(const Cont& k) {
    for (Device d : devices_) with(Step::decode(d), k);
  }
  void emit() {
    TensorOption o;
    o.hierarchical = hier_;
    o.steps = steps_;
    if (o.compressed()) o.codec = c_.codec;
    out_.push_back(std::move(o));
  }

  // T1: the second step of raw data.
  void t1(Scope s, CommOp second, const Cont& k) {
    comm(s, second, false, k);
    encode([&] { comm(s, second, true, [&] { decode(k); }); });
  }
  // T2: the second step of compressed data.
  void t2(Scope s, CommOp second, const Cont& k) {
    comm(s, second, true, [&] { decode(k); });
    decode([&] { t1(s, second, k); });
  }
  // T5: the inter-machine second step of raw data; kRaw / kComp continue with
  // raw or compressed data (the final intra-machine step).
  void t5(CommOp second, const Cont& kRaw, const Cont& kComp) {
    comm(Scope::kInter, second, false, kRaw);
    encode([&] { comm(Scope::kInter, second, true, kComp); });
  }
  // T3: the inter-machine stage of raw data.
  void t3(const Cont& kRaw, const Cont& kComp) {
    comm(Scope::kInter, CommOp::kAllreduce, false, kRaw);
    for (const Pair& p : kRawPairs)
      comm(Scope::kInter, p.first, false, [&] { t5(p.second, kRaw, kComp); });
    if (c_.parameterServer) {
      // The servers sum raw pushes and serve the sum raw or re-encoded.
      comm(Scope::kInter, CommOp::kPush, false, [&] {
        comm(Scope::kInter, CommOp::kPull, false, kRaw);
        if (c_.compression) comm(Scope::kInter, CommOp::kPull, true, kComp);
      });
    }
  }
  // T4: the inter-machine stage of compressed data.
  void t4(const Cont& kRaw, const Cont& kComp) {
    comm(Scope::kInter, CommOp::kAllgather, true, kComp);
    for (const Pair& p : kCompressedPairs) {
      comm(Scope::kInter, p.first, true, [&] {
        comm(Scope::kInter, p.second, true, kComp);
        decode([&] { t5(p.second, kRaw, kComp); });
      });
    }
    if (c_.parameterServer) {
      // The servers decode, sum, and serve the sum raw or re-encoded.
      comm(Scope::kInter, CommOp::kPush, true, [&] {
        comm(Scope::kInter, CommOp::kPull, false, kRaw);
        comm(Scope::kInter, CommOp::kPull, true, kComp);
      });
    }
  }

  void flatRaw() {
    Cont end = [&] { emit(); };
    comm(Scope::kFlat, CommOp::kAllreduce, false, end);
    for (const Pair& p : kRawPairs)
      comm(Scope::kFlat, p.first, false, [&] { t1(Scope::kFlat, p.second, end); });
  }
  void flatCompressed() {
    Cont end = [&] { emit(); };
    encode([&] { comm(Scope::kFlat, CommOp::kAllgather, true, [&] { decode(end); }); });
    for (const Pair& p : kCompressedPairs)
      encode([&] { comm(Scope::kFlat, p.first, true, [&] { t2(Scope::kFlat, p.second, end); }); });
  }
  void hierRaw() {
    Cont end = [&] { emit(); };
    for (const Pair& p : kRawPairs) {
      Cont kRaw = [&] { t1(Scope::kIntra, p.second, end); };
      Cont kComp = [&] { t2(Scope::kIntra, p.second, end); };
      comm(Scope::kIntra, p.first, false, [&] {
        t3(kRaw, kComp);
        encode([&] { t4(kRaw, kComp); });
      });
    }
  }
  void hierCompressed() {
    Cont end = [&] { emit(); };
    for (const Pair& p : kCompressedPairs) {
      Cont kRaw = [&] { t1(Scope::kIntra, p.second, end); };
      Cont kComp = [&] { t2(Scope::kIntra, p.second, end); };
      encode([&] {
        comm(Scope::kIntra, p.first, true, [&] {
          t4(kRaw, kComp);
          decode([&] {
            t3(kRaw, kComp);
            encode([&] { t4(kRaw, kComp); });
          });
        });
      });
    }
  }

  const TreeConfig& c_;
  std::vector<Device> devices_;
  bool hier_ = false;
  std::vector<Step> steps_;
  std::vector<TensorOption> out_;
};

}  // namespace

std::vector<TensorOption> enumerateOptions(const TreeConfig& config) {
  std::vector<TensorOption> out = Builder(config).run();
  if (config.zen)
    for (bool h : {false, true})
      if (h ? config.hierarchical : config.flat)
        for (plan::CommOp op : {plan::CommOp::kZenBalanced, plan::CommOp::kZenCentralized})
          out.push_back(zenOption(op, h));
  return out;
}

TensorOption zenOption(plan::CommOp op, bool hierarchical) {
  TensorOption o;
  o.hierarchical = hierarchical;
  if (hierarchical) {
    o.steps = {Step::comm(plan::Scope::kIntra, plan::CommOp::kReduceScatter, false),
               Step::comm(plan::Scope::kInter, op, false),
               Step::comm(plan::Scope::kIntra, plan::CommOp::kAllgather, false)};
  } else {
    o.steps.push_back(Step::comm(plan::Scope::kFlat, op, false));
  }
  plan::validate(o, "<zen option>");
  return o;
}

TensorOption withCodecDevice(const TensorOption& option, Device device) {
  TensorOption o = option;
  for (Step& s : o.steps)
    if (s.kind != plan::StepKind::kComm) s.device = device;
  return o;
}

bool usesGpuCodec(const TensorOption& option) {
  for (const Step& s : option.steps)
    if (s.kind != plan::StepKind::kComm && s.device == Device::kGpu) return true;
  return false;
}

bool usesCpuCodec(const TensorOption& option) {
  for (const Step& s : option.steps)
    if (s.kind != plan::StepKind::kComm && s.device == Device::kCpu) return true;
  return false;
}

}  // namespace cortado::planner
