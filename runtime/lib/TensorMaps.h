// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// Where each CUtensorMap slot of a layer reads (docs/Runtime.md, "Metadata"):
// pure address arithmetic, kept apart from the driver calls so the host tests
// check it on machines without a GPU.
//
#ifndef MOK_RUNTIME_TENSORMAPS_H
#define MOK_RUNTIME_TENSORMAPS_H

#include "mok/Runtime/mok_runtime.h"

#include <cstdint>
#include <vector>

namespace mok::runtime {

/// The matrix one slot maps: its first element and its row stride. A layer's
/// slots, in order, are also the key of its built descriptors: equal keys
/// mean nothing to rebuild (and nothing to copy during CUDA-graph replay).
struct MapSlot {
  uintptr_t address;
  int64_t rowStride; // elements
  int64_t rows = 0;  // a map whose rows follow the call's T: those rows
  bool operator==(const MapSlot &o) const {
    return address == o.address && rowStride == o.rowStride && rows == o.rows;
  }
  bool operator!=(const MapSlot &o) const { return !(*this == o); }
};

/// The `experts` slots of a tensor-map entry over a dense buffer at `data`:
/// expert e's [rows, cols] matrix starts `e * rows * rowStride` elements in,
/// with the entry's row stride. One slot (experts = 1) is the whole buffer.
inline void appendDenseSlots(uintptr_t data, size_t elementSize,
                             int64_t experts, int64_t rows, int64_t rowStride,
                             std::vector<MapSlot> &out) {
  for (int64_t e = 0; e < experts; ++e)
    out.push_back({data + static_cast<uintptr_t>(e * rows * rowStride) *
                              elementSize,
                   rowStride});
}

/// The `experts` slots of a tensor-map entry over a bound weight view: expert
/// e's matrix starts at the view's element (e, 0, 0), with the view's row
/// stride (the entry's is the dense tensor's, which the view replaces).
/// The same arithmetic as mok_weights_element_address, without its checks
/// (done when the view was bound) and without touching mok_last_error.
inline void appendViewSlots(const mok_expert_weights &view, int64_t experts,
                            std::vector<MapSlot> &out) {
  size_t elementSize = mok_dtype_size(view.dtype);
  for (int64_t e = 0; e < experts; ++e) {
    uintptr_t base =
        view.layout == MOK_WEIGHTS_PER_EXPERT
            ? reinterpret_cast<uintptr_t>(view.expert_pointers[e])
            : reinterpret_cast<uintptr_t>(view.base) +
                  static_cast<uintptr_t>(e * view.expert_stride) * elementSize;
    out.push_back({base, view.row_stride});
  }
}

} // namespace mok::runtime

#endif // MOK_RUNTIME_TENSORMAPS_H
