// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// The target-support query: what convert-mk-to-gpu implements per chip.
//
#include "mok/Dialect/MK/IR/MKSchedule.h"

#include "llvm/Support/CheckedArithmetic.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mok::mk;
namespace sched = mok::mk::schedule;

GemmForm GemmForm::of(GemmOp op) {
  GemmForm f;
  f.epilogue = op.getEpilogue();
  f.bOperands = op.getB().size();
  f.grouped = op.isGrouped();
  f.transposeA = op.getTransposeA();
  f.transposeB = op.getTransposeB();
  f.concat = static_cast<bool>(op.getA2());
  f.kGroups = static_cast<bool>(op.getKOffsets());
  auto out = cast<MemRefType>(op.getOut().getType());
  f.f32Out = out.getElementType().isF32();
  f.saves = !op.getSaves().empty();
  f.gathered = static_cast<bool>(op.getGatherRows());
  f.fp8 = op.isFp8();
  f.mx = op.isMx();
  f.columns = out.getDimSize(f.kGroups ? 2 : 1);
  if (f.kGroups)
    f.groupRows = out.getDimSize(1);
  return f;
}

std::optional<TargetSupport> TargetSupport::forChip(StringRef chip) {
  if (chip == "sm_90a")
    return TargetSupport(/*sm90=*/true);
  if (chip == "sm_100a")
    return TargetSupport(/*sm90=*/false);
  return std::nullopt;
}

unsigned TargetSupport::blockSize(GemmScheduleAttr schedule) const {
  if (schedule.getProducer())
    return sched::producerBlock(schedule.tileM());
  return sched::kBlock;
}

std::string TargetSupport::whyNot(const GemmForm &f,
                                  GemmScheduleAttr schedule) const {
  if (!schedule.usesTensorCores())
    return "";
  std::string why;
  llvm::raw_string_ostream os(why);
  Engine engine = schedule.getEngine();
  bool producer = schedule.getProducer(), multicast = schedule.getMulticast();
  // FP8: E4M3 wgmma with the block scales applied as each k-tile's partial
  // sums are added to the accumulators (sm_90a), K-major operands only.
  // MXFP8: tcgen05's block-scaled MMA (E8M0 scales in Tensor Memory),
  // 128-row tiles of K-major operands.
  if (f.mx) {
    if (engine != Engine::tcgen05)
      return "MXFP8 operands (E8M0 block scales) need tcgen05's block-scaled "
             "MMA (sm_100a); on sm_90a they run on the simt engine";
    if (producer || multicast || f.gathered || f.transposeA || f.transposeB)
      return "MXFP8 operands on tcgen05 are implemented for K-major operands "
             "without a producer, clusters or a gathered A";
    ArrayRef<int64_t> tile = schedule.getTile();
    if (tile[0] != sched::kMaxConsumers * sched::kTileM ||
        tile[1] != sched::kTileN || tile[2] != sched::kTileKFp8 ||
        schedule.getStages() != sched::kStages) {
      os << "MXFP8 operands on tcgen05: tile [" << tile[0] << ", " << tile[1]
         << ", " << tile[2] << "] with " << schedule.getStages()
         << " stages is not implemented; the block-scaled MMA takes M = "
         << sched::kMaxConsumers * sched::kTileM << " (tile ["
         << sched::kMaxConsumers * sched::kTileM << ", " << sched::kTileN
         << ", " << sched::kTileKFp8 << "], " << sched::kStages
         << " stages)";
      return why;
    }
  } else if (f.fp8) {
    if (engine != Engine::wgmma)
      return "FP8 operands with f32 block scales are implemented for the "
             "wgmma (sm_90a) and simt engines; tcgen05 runs MXFP8 (E8M0 "
             "scales)";
    if (multicast || f.gathered)
      return "FP8 operands on wgmma are implemented without clusters or a "
             "gathered A";
    if (f.columns % 2)
      return "FP8 operands on wgmma: the epilogue stores pairs of columns "
             "from registers, so out needs an even number of columns";
    // A k-tile's partial sums take as many registers as the accumulators:
    // 128 columns in all (gate's 64 and up's, or one operand's 128).
    // (concat's two B operands take turns in one box.)
    ArrayRef<int64_t> tile = schedule.getTile();
    int64_t columns = f.concat ? tile[1] : tile[1] * f.bOperands;
    if (columns != sched::kTileN || tile[2] != sched::kTileKFp8 ||
        schedule.getStages() != sched::kStages ||
        (tile[0] != sched::kTileM &&
         tile[0] != sched::kMaxConsumers * sched::kTileM)) {
      os << "FP8 operands on wgmma: tile [" << tile[0] << ", " << tile[1]
         << ", " << tile[2] << "] with " << schedule.getStages()
         << " stages is not implemented; the lowering supports tiles of "
         << sched::kTileM << " or " << sched::kMaxConsumers * sched::kTileM
         << " rows, " << sched::kTileN << " columns in all ("
         << sched::kTileN / 2 << " a B operand with two), K = "
         << sched::kTileKFp8 << " and " << sched::kStages << " stages";
      return why;
    }
  }
  if (f.gathered && engine != Engine::wgmma)
    return "a gathered A operand is implemented for the wgmma engine only";
  // The training forms (saves, M-/N-major operands, concat, k_groups, an
  // f32 out) exist for both tensor-core engines without warp roles or
  // clusters; a gathered A (wgmma) only with an N-major B alone.
  bool dgradForms =
      f.transposeB || f.concat || f.transposeA || f.kGroups || f.f32Out;
  // (With a producer the saves go through the register epilogue's staging
  // after the ring, which the producer's loads never touch.)
  if (f.saves && (multicast || f.gathered))
    return "saves is implemented for wgmma GEMMs without clusters or a "
           "gathered A";
  // (A gathered A with an N-major B: the down dgrad, d_out's rows.)
  bool gatherOk = !f.gathered || (!f.transposeA && !f.concat && !f.kGroups);
  // (With a producer on wgmma: the FP8 forms, and bf16's without
  // k_groups; a gathered A stays the forward's.)
  bool producerOk = !producer || (engine == Engine::wgmma && !f.gathered &&
                                  (f.fp8 || !f.kGroups));
  if (dgradForms && (!producerOk || multicast || !gatherOk ||
                     f.bOperands != (f.concat ? 2u : 1u)))
    return "transpose_a, transpose_b, concat, k_groups and an f32 out are "
           "implemented for tensor-core GEMMs of one B operand (two with "
           "concat) without clusters, with a producer on wgmma (k_groups "
           "there with FP8 operands), and a gathered A only with "
           "transpose_b alone and no producer";
  if (f.transposeA && !f.transposeB)
    return "on the tensor-core engines, transpose_a needs transpose_b";
  if (f.concat && f.transposeA)
    return "concat on the tensor-core engines takes a K-major A";
  ArrayRef<int64_t> tile = schedule.getTile();
  if (f.kGroups && f.groupRows % tile[0]) {
    os << "k_groups on the tensor-core engines: out's M (" << f.groupRows
       << ") must be a multiple of the tile's M (" << tile[0] << ")";
    return why;
  }
  // Multicast (clusters of 2, TMA multicast of B halves): register
  // epilogues (whole column pairs: the shared-memory epilogue reuses stages
  // the partner may already fill), B two 128-row halves (gate + up, or one
  // 256-column operand).
  if (multicast) {
    // (The tile's N is any positive int64_t here: the product is checked.)
    std::optional<int64_t> columns =
        llvm::checkedMul(static_cast<int64_t>(f.bOperands), tile[1]);
    if (!columns || *columns / sched::kTileN != 2) {
      os << "with multicast the B boxes of a tile must be two " << sched::kTileN
         << "-row halves (gate and up, or one operand of " << 2 * sched::kTileN
         << "-column tiles); got " << f.bOperands << " operand(s) of "
         << tile[1] << "-column tiles";
      return why;
    }
    if (f.columns % 2)
      return "with multicast the epilogue stores pairs of columns from "
             "registers: out needs an even number of columns";
  }
  if (engine != tensorCoreEngine()) {
    os << "the " << stringifyEngine(engine) << " engine needs a "
       << (engine == Engine::wgmma ? "sm_90a" : "sm_100a")
       << " kernel (mok.kernel chip = \""
       << (engine == Engine::wgmma ? "sm_90a" : "sm_100a") << "\"), got \""
       << chip() << "\"";
    return why;
  }
  // The tiles implemented: [64, 128, 64] with 4 stages; on sm_90a also 128
  // rows (two consumer warpgroups) and, with one B operand, 256 columns
  // (the same stage bytes; concat's two B operands take turns in one box).
  bool wgmma = engine == Engine::wgmma;
  bool wide = tile[1] == 2 * sched::kTileN && wgmma &&
              f.bOperands == (f.concat ? 2u : 1u);
  // (tcgen05 at 128 rows: one M = 128 MMA a k16 step, without a gathered
  // A, a producer or clusters; the MXFP8 kernels' bf16 shared expert.)
  bool tall = tile[0] == sched::kMaxConsumers * sched::kTileM &&
              (wgmma || (!f.gathered && !producer && !multicast));
  if (!f.fp8 && ((tile[0] != sched::kTileM && !tall) ||
      (tile[1] != sched::kTileN && !wide) || tile[2] != sched::kTileK ||
      schedule.getStages() != sched::kStages)) {
    os << "tile [" << tile[0] << ", " << tile[1] << ", " << tile[2] << "] with "
       << schedule.getStages()
       << " stages is not implemented; the lowering supports tile ["
       << sched::kTileM << ", " << sched::kTileN << ", " << sched::kTileK
       << "] with " << sched::kStages << " stages (and, for wgmma, M = "
       << sched::kMaxConsumers * sched::kTileM
       << ", and N = " << 2 * sched::kTileN << " with one B operand)";
    return why;
  }
  if (producer && f.columns % 2)
    return "with a producer the epilogue stores pairs of columns from "
           "registers: out needs an even number of columns";
  if (ArrayRef<int64_t> r = schedule.getRegisters(); !r.empty()) {
    // Consumers and producer share the registers of the even split.
    unsigned threads = blockSize(schedule);
    int64_t consumers = tile[0] / sched::kTileM;
    int64_t even = sched::evenRegisters(threads);
    if (consumers * r[0] + r[1] > (consumers + 1) * even) {
      os << "registers [" << r[0] << ", " << r[1] << "] for " << consumers
         << " consumer warpgroup(s) and a producer exceed the register file ("
         << even << " a thread for " << threads << " threads)";
      return why;
    }
    // setmaxnreg increases the consumers and decreases the producer
    // warpgroup from the even share the kernel is compiled for.
    if (r[0] < even || r[1] > even) {
      os << "registers [" << r[0] << ", " << r[1]
         << "]: the consumers need at least and the producer at most the "
            "even share ("
         << even << " a thread for " << threads << " threads)";
      return why;
    }
  }
  return "";
}
