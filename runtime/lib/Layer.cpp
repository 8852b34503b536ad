// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// mok_layer: a compiled layer described by the compiler's metadata
// (docs/Runtime.md), its module, its workspace and its TMA descriptors.
//
#include "mok/Runtime/mok_runtime.h"

#include "Comm.h"
#include "Error.h"
#include "Json.h"
#include "Module.h"
#include "TensorMaps.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace mok::runtime;

namespace {

struct Param {
  // role: input, output, workspace, tensor_maps, status, tokens
  std::string name, role;
  mok_dtype dtype = MOK_DTYPE_BF16; // read from the metadata
  std::vector<int64_t> shape;
  // A kernel for any token count ("call_rows", version 4): dimension 0 is
  // rowsScale * T + rowsOffset at a call of T tokens (shape has it at the
  // capacity); rowsScale 0: static.
  int64_t rowsScale = 0, rowsOffset = 0;
  std::vector<int64_t> callShape(int64_t tokens) const {
    std::vector<int64_t> s = shape;
    if (rowsScale && !s.empty())
      s[0] = rowsScale * tokens + rowsOffset;
    return s;
  }
  // "access": "tensor_maps": the kernel never dereferences the pointer, it
  // reads the buffer through tensor maps only — what lets a weight view
  // (not one dense tensor) stand in for it.
  bool tensorMapsOnly = false;
  // "align" (version 5): the bytes the buffer's address must be a multiple
  // of, where the kernel relies on it (it writes the buffer 16 bytes at a
  // time, with no code for other addresses); 0: the element's size.
  int64_t align = 0;
  /// At most 2^62 / the element size: mok_layer_create refuses larger
  /// buffers (and a buffer with an empty dimension holds nothing).
  int64_t elements() const {
    for (int64_t d : shape)
      if (d == 0)
        return 0;
    int64_t n = 1;
    for (int64_t d : shape)
      n *= d;
    return n;
  }
};

struct TensorMapSpec {
  std::string buffer;
  int64_t rows, cols, rowStride, boxRows, boxCols;
  int64_t experts = 1; // consecutive slots, slot e over expert e's matrix
  int param = -1;      // the index of `buffer` among the params
  // Any T ("call_rows"): the map's rows at a call, so that TMA reads the
  // rows past the call's as zeros.
  int64_t rowsScale = 0, rowsOffset = 0;
  int64_t callRows(int64_t tokens) const {
    return rowsScale ? rowsScale * tokens + rowsOffset : rows;
  }
};

/// The elements of a dense buffer of `shape` (0 with an empty dimension).
int64_t elementsOf(const std::vector<int64_t> &shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

/// A weight view bound to an input (mok_layer_bind_weights), with its own
/// copy of a per-expert pointer table: the caller's need not outlive the call.
struct Binding {
  bool bound = false;
  mok_expert_weights view{};
  std::vector<void *> table;
};

} // namespace

struct mok_layer_s {
  std::string kernel;
  uint32_t block = 0;
  bool cooperative = false;
  uint32_t cluster = 1; // CTAs per cluster (metadata "cluster", version 3)
  uint32_t dynamicSmem = 0;
  std::vector<Param> params;
  std::vector<std::string> zeroFirst;
  std::vector<TensorMapSpec> maps;
  size_t slots = 0;        // CUtensorMaps: the sum of the maps' `experts`
  int mapStorage = -1;     // the param of role tensor_maps
  std::vector<int> inputs; // indices of the input params, in order
  // Indices of the output params, in order: the first is the output (`out`
  // of mok_layer_check/mok_layer_forward), the others are extra outputs,
  // passed by name among the named tensors.
  std::vector<int> outputs;
  std::vector<Binding> views; // per param; bound only for inputs
  // Expert parallelism: the size the kernel was compiled for (metadata
  // "ep", 1 without it) and the group it runs in (mok_layer_set_ep_group).
  int32_t epSize = 1;
  mok_ep_group group{1, 0, nullptr};
  // A kernel for ep > 1 (metadata version 5): the bytes of symmetric
  // exchange buffer a rank needs, and its params of roles "peers" (the peer
  // table), "rank" and "epoch" (by value).
  uint64_t symmetricBytes = 0;
  int peersParam = -1, rankParam = -1, epochParam = -1;
  // The param of role "symmetric" (u8 [symmetric_bytes]): the rank's own
  // exchange buffer, whose regions the kernel reads.
  int symmetricParam = -1;
  // The receive capacity of an expert-parallel kernel (metadata
  // recv_capacity; 0 when absent), for its report.
  int64_t recvCapacity = 0;
  // A hash of the metadata (FNV-1a, 64 bits): binding to an NCCL
  // communicator checks that every rank binds the same layer.
  uint64_t fingerprint = 0;
  // The communicator it is bound to (mok_layer_bind_comm), its exchange
  // buffer (null for ep = 1), whether the layer allocated that buffer, and
  // the epoch its last forward passed (0: none since binding).
  mok_comm comm = nullptr;
  mok_symmetric exchange = nullptr;
  bool ownsExchange = false;
  uint64_t epoch = 0;
  // A kernel for any token count (metadata "any_tokens", version 4): the
  // capacity, the param that takes the call's T by value, and the T of the
  // call being checked (the capacity otherwise).
  bool anyTokens = false;
  int64_t maxTokens = 0;
  int tokensParam = -1;
  int64_t callTokens = 0;

  // After mok_layer_load:
  mok_module module = nullptr;
  int device = -1;
  uint32_t grid = 0;
  std::vector<CUdeviceptr> workspace; // per param; 0 for inputs/output
  std::vector<MapSlot> mapKey;        // what the built maps read, per slot
  std::vector<unsigned char> mapHost; // 128 bytes a map, 64-aligned inside
  // CUDA graphs: a captured upload reads its host source when the graph
  // replays, so each capture builds its maps into a buffer of its own, kept
  // until the layer is destroyed; and once a graph exists, a replay may
  // have overwritten the device copy, so every later call uploads again.
  std::vector<std::vector<unsigned char>> captured;
  // The kernel's report (the param of role "status", 8 words): pinned host
  // memory mapped into the device's address space, so the kernel writes it
  // with no copy and the host reads it after the call (zero: nothing to
  // report). Null when the kernel has none.
  int statusParam = -1;
  volatile int32_t *report = nullptr;
  // The largest grid the kernel's CTAs fill at once (occupancy), and the
  // grid mok_layer_set_grid chose (0: the default, one CTA an SM).
  uint32_t maxGrid = 0, gridChosen = 0;
  // Testing only (MOK_TESTING_OVERSUBSCRIBE=1 when mok_layer_set_grid ran):
  // a grid larger than can be resident, launched without the cooperative
  // guarantee, so that the bounded grid barriers' timeout can be tested.
  bool oversubscribed = false;

  ~mok_layer_s() {
    if (module) {
      const Driver *d = module->driver;
      d->ctxSetCurrent(module->context);
      for (size_t i = 0; i < workspace.size(); ++i)
        if (workspace[i] && static_cast<int>(i) != statusParam)
          d->memFree(workspace[i]);
      if (report)
        d->memFreeHost(const_cast<int32_t *>(report));
      destroyModule(module);
    }
  }
};

/// Unbinds the layer's communicator: frees the exchange buffer it allocated
/// (or gives back the one it was given). Returns the first failure (its
/// message recorded); the binding is gone either way.
static mok_status releaseComm(mok_layer layer) {
  mok_status status = MOK_OK;
  if (layer->exchange) {
    if (layer->ownsExchange)
      status = freeSymmetric(layer->exchange);
    else
      layer->exchange->user = nullptr;
  }
  if (layer->comm)
    countBinding(layer->comm, -1);
  layer->comm = nullptr;
  layer->exchange = nullptr;
  layer->ownsExchange = false;
  layer->epoch = 0;
  return status;
}

//===----------------------------------------------------------------------===//
// Metadata
//===----------------------------------------------------------------------===//

static bool dtypeOf(const std::string &s, mok_dtype &out) {
  if (s == "bf16")
    out = MOK_DTYPE_BF16;
  else if (s == "f32")
    out = MOK_DTYPE_F32;
  else if (s == "i32")
    out = MOK_DTYPE_I32;
  else if (s == "i64")
    out = MOK_DTYPE_I64;
  else if (s == "u8")
    out = MOK_DTYPE_U8;
  else if (s == "f8e4m3")
    out = MOK_DTYPE_F8E4M3;
  else
    return false;
  return true;
}

/// Whether a buffer of `shape` and `elementSize`-byte elements holds at
/// most 2^62 bytes (the product computed without overflowing).
static bool fitsInBytes(const std::vector<int64_t> &shape, size_t elementSize) {
  const uint64_t limit = uint64_t(1) << 62;
  for (int64_t d : shape)
    if (d == 0)
      return true;
  uint64_t bytes = elementSize;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes) ||
        bytes > limit)
      return false;
  }
  return bytes <= limit;
}

static std::string shapeText(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static bool readByTMA(mok_layer layer, const std::string &name) {
  for (const TensorMapSpec &m : layer->maps)
    if (m.buffer == name)
      return true;
  return false;
}

namespace {
/// Reads typed members, recording the first problem as a metadata error.
struct Reader {
  std::string error;
  bool ok() const { return error.empty(); }
  const json::Value *member(const json::Value &o, const std::string &key,
                            json::Value::Kind kind, const std::string &where) {
    const json::Value *v = o.get(key);
    if (!v || v->kind != kind) {
      if (ok())
        error = where + ": missing or mistyped '" + key + "'";
      return nullptr;
    }
    return v;
  }
  /// The integer member `key` in [min, max] (max: what a double holds
  /// exactly, 2^53, unless said; a value past it would be truncated where
  /// it is stored, e.g. a uint32_t block).
  int64_t integer(const json::Value &o, const std::string &key,
                  const std::string &where, int64_t min = 0,
                  int64_t max = kMaxInteger) {
    const json::Value *v = member(o, key, json::Value::Number, where);
    if (!v)
      return 0;
    if (!v->isInteger() || v->number < static_cast<double>(min) ||
        v->number > static_cast<double>(max)) {
      if (ok())
        error = where + ": '" + key + "' must be an integer >= " +
                std::to_string(min) + " and <= " + std::to_string(max);
      return 0;
    }
    return static_cast<int64_t>(v->number);
  }
  static constexpr int64_t kMaxInteger = int64_t(1) << 53;
  std::string string(const json::Value &o, const std::string &key,
                     const std::string &where) {
    const json::Value *v = member(o, key, json::Value::String, where);
    return v ? v->string : "";
  }
};
} // namespace

extern "C" mok_status mok_layer_create(const char *metadataJson,
                                       mok_layer *out) {
  if (!metadataJson || !out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "metadata/out: is NULL";
  json::Value root;
  std::string err;
  if (!json::parse(metadataJson, root, err))
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "metadata: not JSON (" << err << ")";
  if (root.kind != json::Value::Object)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "metadata: not a JSON object";
  Reader r;
  const json::Value *version = root.get("mok_metadata_version");
  // Version 2 adds params' "access" and tensor maps' "experts"; both are
  // optional with version 1's meaning as default, so version 1 reads alike.
  if (!version || !version->isInteger() || version->number < 1 ||
      version->number > 5)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "metadata: expected mok_metadata_version 1 to 5 (recompile the "
              "layer with this version of mok)";
  auto layer = std::make_unique<mok_layer_s>();
  layer->fingerprint = 14695981039346656037ull;
  for (const char *c = metadataJson; *c; ++c)
    layer->fingerprint = (layer->fingerprint ^ static_cast<unsigned char>(*c)) *
                         1099511628211ull;
  layer->kernel = r.string(root, "kernel", "metadata");
  layer->block =
      static_cast<uint32_t>(r.integer(root, "block", "metadata", 1, 1024));
  layer->dynamicSmem = static_cast<uint32_t>(
      r.integer(root, "dynamic_shared_memory", "metadata", 0, UINT32_MAX));
  if (const json::Value *c =
          r.member(root, "cooperative", json::Value::Bool, "metadata"))
    layer->cooperative = c->boolean;
  // Optional (version 3): the kernel pairs CTAs of a cluster.
  if (root.get("cluster")) {
    int64_t cluster = r.integer(root, "cluster", "metadata", 1);
    if (r.ok() && cluster > 8)
      r.error = "metadata: 'cluster' must be at most 8 CTAs";
    layer->cluster = static_cast<uint32_t>(cluster);
  }
  // Optional: the compiler emits it once it compiles expert-parallel layers.
  if (root.get("ep")) {
    int64_t ep = r.integer(root, "ep", "metadata", 1);
    if (r.ok() && ep > INT32_MAX)
      r.error = "metadata: 'ep' must be at most " + std::to_string(INT32_MAX);
    layer->epSize = static_cast<int32_t>(ep);
  }
  if (root.get("recv_capacity"))
    layer->recvCapacity = r.integer(root, "recv_capacity", "metadata", 1);
  // Version 5: an expert-parallel kernel's exchange buffer.
  if (root.get("symmetric_bytes"))
    layer->symmetricBytes = static_cast<uint64_t>(
        r.integer(root, "symmetric_bytes", "metadata", 1));
  // A kernel of ep = 1 may exchange too: the compiler's self-exchange plans
  // it as the one rank of a group, bound to a communicator of one rank.
  bool exchanges = layer->epSize > 1 || layer->symmetricBytes;
  if (r.ok() && exchanges && version->number < 5)
    r.error = "metadata: 'ep' = " + std::to_string(layer->epSize) +
              " needs mok_metadata_version 5 (the exchange's "
              "'symmetric_bytes' and its params of roles peers, rank and "
              "epoch), got version " +
              std::to_string(static_cast<int>(version->number));
  if (r.ok() && layer->epSize > 1 && !layer->symmetricBytes)
    r.error = "metadata: a kernel for ep = " + std::to_string(layer->epSize) +
              " without 'symmetric_bytes' (the exchange buffer a rank needs)";
  // Optional (version 4): a kernel for every token count up to a capacity.
  if (root.get("any_tokens")) {
    if (const json::Value *a =
            r.member(root, "any_tokens", json::Value::Bool, "metadata"))
      layer->anyTokens = a->boolean;
    if (layer->anyTokens)
      layer->maxTokens = r.integer(root, "max_tokens", "metadata", 1);
  }
  // "call_rows": [scale, offset] of a param or map, rows that follow T.
  auto callRows = [&](const json::Value &o, const std::string &where,
                      int64_t rows, int64_t &scale, int64_t &offset) {
    const json::Value *c = o.get("call_rows");
    if (!c || !r.ok())
      return;
    if (!layer->anyTokens) {
      r.error = where + ": 'call_rows' in a kernel for one token count";
      return;
    }
    if (c->kind != json::Value::Array || c->array.size() != 2 ||
        !c->array[0].isInteger() || !c->array[1].isInteger() ||
        c->array[0].number < 1 || c->array[1].number < 0) {
      r.error = where + ": 'call_rows' must be [scale >= 1, offset >= 0]";
      return;
    }
    scale = static_cast<int64_t>(c->array[0].number);
    offset = static_cast<int64_t>(c->array[1].number);
    // At the capacity the rows are the static ones.
    if (static_cast<__int128>(scale) * layer->maxTokens + offset != rows)
      r.error = where + ": 'call_rows' [" + std::to_string(scale) + ", " +
                std::to_string(offset) + "] at max_tokens = " +
                std::to_string(layer->maxTokens) + " is not its " +
                std::to_string(rows) + " rows";
  };
  if (const json::Value *z = root.get("zero_before_first_launch"))
    for (const json::Value &v : z->array)
      layer->zeroFirst.push_back(v.string);
  const json::Value *params =
      r.member(root, "params", json::Value::Array, "metadata");
  if (params)
    for (size_t i = 0; i < params->array.size() && r.ok(); ++i) {
      const json::Value &p = params->array[i];
      std::string where = "metadata: params[" + std::to_string(i) + "]";
      Param param;
      param.name = r.string(p, "name", where);
      param.role = r.string(p, "role", where);
      std::string dtype = r.string(p, "dtype", where);
      if (r.ok() && !dtypeOf(dtype, param.dtype))
        r.error = where + ": unknown dtype '" + dtype + "'";
      if (const json::Value *shape =
              r.member(p, "shape", json::Value::Array, where))
        for (const json::Value &d : shape->array) {
          if (!d.isInteger() || d.number < 0) {
            r.error = where + ": shape entries must be integers >= 0 and <= "
                              "2^53";
            break;
          }
          param.shape.push_back(static_cast<int64_t>(d.number));
        }
      // Sizes are computed in int64 (bytes, element offsets): a buffer must
      // stay well inside it.
      if (r.ok() && !fitsInBytes(param.shape, mok_dtype_size(param.dtype)))
        r.error = where + " ('" + param.name + "'): " +
                  mok_dtype_name(param.dtype) + " " + shapeText(param.shape) +
                  " holds more than 2^62 bytes";
      if (r.ok() && p.get("access")) {
        std::string access =
            r.string(p, "access", where + " ('" + param.name + "')");
        if (access == "tensor_maps")
          param.tensorMapsOnly = true;
        else if (r.ok() && access != "pointer")
          r.error = where + " ('" + param.name + "'): unknown access '" +
                    access + "' (expected 'pointer' or 'tensor_maps')";
      }
      if (r.ok() && !param.shape.empty())
        callRows(p, where + " ('" + param.name + "')", param.shape[0],
                 param.rowsScale, param.rowsOffset);
      if (r.ok() && p.get("align")) {
        param.align = r.integer(p, "align", where + " ('" + param.name + "')",
                                1, 256);
        if (r.ok() && (param.align & (param.align - 1)))
          r.error = where + " ('" + param.name +
                    "'): align must be a power of two, got " +
                    std::to_string(param.align);
      }
      if (r.ok()) {
        if (param.role == "tokens") {
          if (!layer->anyTokens)
            r.error = where + ": role 'tokens' in a kernel for one token count";
          else if (param.dtype != MOK_DTYPE_I64 || !param.shape.empty())
            r.error = where + ": the call's token count (role 'tokens') must "
                              "be an i64 scalar (shape [])";
          else if (layer->tokensParam >= 0)
            r.error = where + ": more than one parameter has role 'tokens'";
          layer->tokensParam = static_cast<int>(layer->params.size());
        } else if (param.role == "input")
          layer->inputs.push_back(static_cast<int>(layer->params.size()));
        else if (param.role == "output")
          layer->outputs.push_back(static_cast<int>(layer->params.size()));
        else if (param.role == "status") {
          if (param.dtype != MOK_DTYPE_I32 || param.shape.size() != 1 ||
              param.shape[0] < 8)
            r.error = where + ": the kernel's report (role 'status') must be "
                              "i32 [8] or longer";
          else if (layer->statusParam >= 0)
            r.error = where + ": more than one parameter has role 'status'";
          layer->statusParam = static_cast<int>(layer->params.size());
        } else if (param.role == "peers" || param.role == "rank" ||
                   param.role == "epoch") {
          // An expert-parallel kernel's: the peer table (a pointer to
          // `ep` uint64), its rank (i32) and the launch's epoch (a u64),
          // these two by value.
          int &slot = param.role == "peers"  ? layer->peersParam
                      : param.role == "rank" ? layer->rankParam
                                             : layer->epochParam;
          bool shapeOk =
              param.role == "peers"
                  ? param.dtype == MOK_DTYPE_I64 && param.shape.size() == 1 &&
                        param.shape[0] == layer->epSize
                  : param.shape.empty() &&
                        param.dtype == (param.role == "rank" ? MOK_DTYPE_I32
                                                             : MOK_DTYPE_I64);
          if (!layer->symmetricBytes)
            r.error = where + ": role '" + param.role +
                      "' in a kernel that exchanges nothing (ep = 1 without "
                      "'symmetric_bytes')";
          else if (!shapeOk)
            r.error =
                where + ": role '" + param.role + "' must be " +
                (param.role == "peers"
                     ? "i64 [" + std::to_string(layer->epSize) +
                           "] (one address a rank)"
                     : param.role == "rank" ? std::string("an i32 scalar (shape [])")
                                            : std::string("an i64 scalar (shape [])"));
          else if (slot >= 0)
            r.error = where + ": more than one parameter has role '" +
                      param.role + "'";
          slot = static_cast<int>(layer->params.size());
        } else if (param.role == "symmetric") {
          if (!layer->symmetricBytes)
            r.error = where + ": role 'symmetric' in a kernel that exchanges "
                              "nothing (ep = 1 without 'symmetric_bytes')";
          else if (param.dtype != MOK_DTYPE_U8 || param.shape.size() != 1 ||
                   static_cast<uint64_t>(param.shape[0]) !=
                       layer->symmetricBytes)
            r.error = where + ": role 'symmetric' must be u8 [" +
                      std::to_string(layer->symmetricBytes) +
                      "] (the symmetric_bytes of the exchange buffer)";
          else if (layer->symmetricParam >= 0)
            r.error = where + ": more than one parameter has role 'symmetric'";
          layer->symmetricParam = static_cast<int>(layer->params.size());
        } else if (param.role != "workspace" && param.role != "tensor_maps")
          r.error = where + ": unknown role '" + param.role + "'";
      }
      layer->params.push_back(std::move(param));
    }
  if (const json::Value *maps = root.get("tensor_maps"))
    for (size_t i = 0; i < maps->array.size() && r.ok(); ++i) {
      const json::Value &m = maps->array[i];
      std::string where = "metadata: tensor_maps[" + std::to_string(i) + "]";
      TensorMapSpec spec{r.string(m, "buffer", where),
                         r.integer(m, "rows", where, 1),
                         r.integer(m, "cols", where, 1),
                         r.integer(m, "row_stride", where, 1),
                         r.integer(m, "box_rows", where, 1, 256),
                         r.integer(m, "box_cols", where, 1, 256)};
      if (m.get("experts"))
        spec.experts = r.integer(m, "experts", where, 1);
      callRows(m, where, spec.rows, spec.rowsScale, spec.rowsOffset);
      if (r.ok() && spec.rowsScale && spec.experts != 1)
        r.error = where + ": 'call_rows' with experts > 1";
      layer->maps.push_back(spec);
    }
  if (r.ok() && layer->anyTokens && layer->tokensParam < 0)
    r.error = "metadata: a kernel for any token count without a parameter "
              "of role 'tokens'";
  if (r.ok() && layer->symmetricBytes)
    // (An epoch by value is optional: the compiler's kernels count their
    // launches on the device.)
    for (auto [slot, role] : {std::pair{layer->peersParam, "peers"},
                              {layer->rankParam, "rank"},
                              {layer->symmetricParam, "symmetric"}})
      if (slot < 0 && r.ok())
        r.error = "metadata: a kernel for ep = " +
                  std::to_string(layer->epSize) +
                  " without a parameter of role '" + role + "'";
  if (!r.ok())
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << r.error;
  layer->callTokens = layer->maxTokens;
  if (layer->outputs.empty())
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "metadata: no parameter has role 'output'";
  auto find = [&](const std::string &name) {
    for (size_t i = 0; i < layer->params.size(); ++i)
      if (layer->params[i].name == name)
        return static_cast<int>(i);
    return -1;
  };
  for (size_t i = 0; i < layer->maps.size(); ++i) {
    TensorMapSpec &m = layer->maps[i];
    m.param = find(m.buffer);
    if (m.param < 0)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "metadata: tensor map of unknown buffer '" << m.buffer << "'";
    // A map past its buffer would have TMA read (or write) memory that is
    // not the operand's, silently: refuse such metadata here.
    const Param &p = layer->params[m.param];
    std::string where =
        "metadata: tensor_maps[" + std::to_string(i) + "] ('" + m.buffer + "')";
    if (p.dtype != MOK_DTYPE_BF16 && p.dtype != MOK_DTYPE_F8E4M3)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << where << ": tensor maps are bf16 or f8e4m3, the buffer is "
             << mok_dtype_name(p.dtype);
    // A box row is one 128-byte swizzle row: 64 bf16 or 128 FP8 elements.
    if (m.boxCols * static_cast<int64_t>(mok_dtype_size(p.dtype)) > 128)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << where << ": box_cols " << m.boxCols << " of "
             << mok_dtype_name(p.dtype)
             << " is more than the 128 bytes of a swizzled box row";
    if (m.rowStride < m.cols)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << where << ": row_stride " << m.rowStride << " is less than cols "
             << m.cols;
    // (experts*rows - 1) * row_stride + cols, in 128 bits: each factor is
    // at most 2^53, so the product fits there, not in int64.
    __int128 end128 =
        (static_cast<__int128>(m.experts) * m.rows - 1) * m.rowStride + m.cols;
    if (end128 > p.elements()) {
      std::string end = end128 > INT64_MAX
                            ? std::string("past 2^63")
                            : std::to_string(static_cast<int64_t>(end128));
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << where << ": " << m.experts << " x [" << m.rows << ", " << m.cols
             << "] with row stride " << m.rowStride << " ends at element "
             << end << ", past the buffer's " << p.elements();
    }
    layer->slots += static_cast<size_t>(m.experts);
  }
  for (size_t i = 0; i < layer->params.size(); ++i) {
    const Param &p = layer->params[i];
    if (p.role == "tensor_maps") {
      if (layer->mapStorage >= 0)
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << "metadata: more than one parameter has role 'tensor_maps'";
      layer->mapStorage = static_cast<int>(i);
    }
    if (p.tensorMapsOnly && !readByTMA(layer.get(), p.name))
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "metadata: params[" << i << "] ('" << p.name
             << "'): access 'tensor_maps' but no tensor_maps entry views it";
  }
  // The kernel finds map j's slots by counting: the buffer must hold exactly
  // one CUtensorMap (128 bytes, 16 i64) per slot.
  size_t storage =
      layer->mapStorage < 0
          ? 0
          : static_cast<size_t>(layer->params[layer->mapStorage].elements()) *
                mok_dtype_size(layer->params[layer->mapStorage].dtype);
  if (storage != 128 * layer->slots) {
    if (layer->mapStorage < 0)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "metadata: the tensor_maps entries need " << layer->slots
             << " CUtensorMap slots, but no parameter has role 'tensor_maps'";
    const Param &p = layer->params[layer->mapStorage];
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "metadata: the tensor_maps entries need " << layer->slots
           << " CUtensorMap slots (128 bytes, 16 i64 each), but the '" << p.name
           << "' parameter holds " << p.elements() << " "
           << mok_dtype_name(p.dtype) << " elements (" << storage << " bytes)";
  }
  // Operands are bound by name: a second param of the same name could
  // never be given.
  for (size_t i = 0; i < layer->params.size(); ++i)
    if (int first = find(layer->params[i].name); first != static_cast<int>(i))
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "metadata: params[" << i << "] ('" << layer->params[i].name
             << "'): the name of params[" << first << "] too";
  for (const std::string &z : layer->zeroFirst)
    if (find(z) < 0 || layer->params[find(z)].role != "workspace")
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "metadata: zero_before_first_launch names '" << z
             << "', which is not a workspace buffer";
  layer->views.resize(layer->params.size());
  addHandle(HandleKind::Layer, layer.get());
  *out = layer.release();
  return ok();
}

/// A live layer, or the error naming `layer` (NULL, destroyed, forged).
static mok_status checkLayer(mok_layer layer) {
  return checkHandle(HandleKind::Layer, layer);
}

extern "C" void mok_layer_destroy(mok_layer layer) {
  if (!layer) {
    ok();
    return;
  }
  // A second destroy (or a pointer that is no layer) is refused, recorded
  // in mok_last_error, and frees nothing.
  if (mok_status s = checkLayer(layer)) {
    (void)s;
    return;
  }
  removeHandle(HandleKind::Layer, layer);
  mok_status unbound = releaseComm(layer);
  delete layer;
  if (!unbound)
    ok();
}

/// The error of an accessor given a bad index: `count` entries of `what`.
static void badIndex(const char *what, int index, size_t count) {
  mok_status s = Fail(MOK_ERROR_INVALID_ARGUMENT)
                 << "index: expected 0 <= index < " << count << " (the layer's "
                 << what << "), got " << index;
  (void)s; // recorded; the accessor returns NULL
}

extern "C" int mok_layer_input_count(mok_layer layer) {
  if (checkLayer(layer))
    return 0;
  return static_cast<int>(layer->inputs.size());
}

extern "C" const char *mok_layer_input_name(mok_layer layer, int index) {
  if (checkLayer(layer))
    return nullptr;
  if (index < 0 || index >= static_cast<int>(layer->inputs.size())) {
    badIndex("inputs", index, layer->inputs.size());
    return nullptr;
  }
  return layer->params[layer->inputs[index]].name.c_str();
}

extern "C" int mok_layer_output_count(mok_layer layer) {
  if (checkLayer(layer))
    return 0;
  return static_cast<int>(layer->outputs.size());
}

extern "C" const char *mok_layer_output_name(mok_layer layer, int index) {
  if (checkLayer(layer))
    return nullptr;
  if (index < 0 || index >= static_cast<int>(layer->outputs.size())) {
    badIndex("outputs", index, layer->outputs.size());
    return nullptr;
  }
  return layer->params[layer->outputs[index]].name.c_str();
}

//===----------------------------------------------------------------------===//
// Argument checks
//===----------------------------------------------------------------------===//

/// A dense row-major tensor of the param's dtype and shape, aligned to its
/// element size — and to 16 bytes, with 16-byte row strides, when the
/// kernel reads it through a TMA descriptor (`tma`).
static mok_status checkDense(const mok_tensor *t, const Param &p, bool tma,
                             int64_t tokens) {
  const std::vector<int64_t> shape = p.callShape(tokens);
  if (mok_status s =
          checkTensor(t, p.name.c_str(), p.dtype,
                      static_cast<int32_t>(shape.size()), shape.data(), tma))
    return s;
  if (p.align > 1 &&
      reinterpret_cast<uintptr_t>(t->data) % static_cast<uintptr_t>(p.align))
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << p.name << ": data must be " << p.align
           << "-byte aligned (the kernel writes it " << p.align
           << " bytes at a time), got address 0x"
           << Hex{static_cast<uint64_t>(reinterpret_cast<uintptr_t>(t->data))};
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] > 1 && t->strides[d] != stride)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << p.name << ": expected a dense row-major tensor; dimension " << d
             << " has stride " << t->strides[d] << ", expected " << stride;
    stride *= shape[d];
  }
  return MOK_OK;
}

/// The address a kernel parameter gets for a bound weight view: expert 0's
/// (a kernel that accepts views never dereferences it; this keeps the
/// parameter meaningful for debugging).
static void *viewPointer(const mok_expert_weights &w) {
  return w.layout == MOK_WEIGHTS_PER_EXPERT ? w.expert_pointers[0] : w.base;
}

/// "x, top_experts, ..." for the params at `indices`, from `from` on.
static std::string nameList(mok_layer layer, const std::vector<int> &indices,
                            size_t from = 0) {
  std::string list;
  for (size_t i = from; i < indices.size(); ++i)
    list += (list.empty() ? "" : ", ") + layer->params[indices[i]].name;
  return list;
}

/// The bytes [begin, end) of a dense tensor checked against `p`: its
/// elements are contiguous from `data` on (checkDense), so `end` is `data`
/// plus the param's size; empty for a tensor without elements.
struct Extent {
  uintptr_t begin, end;
  bool overlaps(const Extent &o) const {
    return begin < end && o.begin < o.end && begin < o.end && o.begin < end;
  }
};

static Extent extentOf(const void *data, const Param &p, int64_t tokens) {
  uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  return {begin, begin + static_cast<uintptr_t>(
                             elementsOf(p.callShape(tokens))) *
                             mok_dtype_size(p.dtype)};
}

/// Refuses an output whose bytes overlap another output's or a dense
/// input's: the kernel would read what it writes, or two outputs would
/// clobber each other, silently. Inputs may overlap each other (they are
/// only read). Inputs bound to weight views are not checked: a view is not
/// one range of bytes (one allocation per expert, or rows with gaps between
/// them), and a trainer does not write its weights through the layer.
static mok_status checkOutputOverlaps(mok_layer layer,
                                      const std::vector<void *> &pointers) {
  auto extent = [&](int index) {
    return extentOf(pointers[index], layer->params[index],
                    layer->callTokens);
  };
  for (size_t i = 0; i < layer->outputs.size(); ++i) {
    int o = layer->outputs[i];
    Extent out = extent(o);
    // The first output is passed as `out`, the others among the inputs.
    std::string what = i == 0 ? "out: '" : "outputs: '";
    auto refuse = [&](const char *kind, int other, const Extent &e) {
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << what << layer->params[o].name << "' (bytes [0x"
             << Hex{out.begin} << ", 0x" << Hex{out.end} << ")) overlaps the "
             << kind << " '" << layer->params[other].name << "' ([0x"
             << Hex{e.begin} << ", 0x" << Hex{e.end}
             << ")); an output may share memory with neither an input nor "
                "another output";
    };
    for (int in : layer->inputs)
      if (!layer->views[in].bound && out.overlaps(extent(in)))
        return refuse("input", in, extent(in));
    for (size_t j = 0; j < i; ++j)
      if (out.overlaps(extent(layer->outputs[j])))
        return refuse("output", layer->outputs[j], extent(layer->outputs[j]));
  }
  return MOK_OK;
}

/// A kernel for any token count: the call's T, the rows of its first input
/// whose rows are the tokens (x, or a backward's d_out), checked against
/// the capacity. T = 0 is refused: there is nothing to launch (an empty
/// output needs no kernel; a backward's weight gradients are zeros).
static mok_status callTokensOf(mok_layer layer, const mok_named_tensor *inputs,
                               size_t count) {
  layer->callTokens = layer->maxTokens;
  if (!layer->anyTokens)
    return MOK_OK;
  for (int index : layer->inputs) {
    const Param &p = layer->params[index];
    if (p.rowsScale != 1 || p.rowsOffset != 0)
      continue;
    for (size_t i = 0; i < count; ++i) {
      if (!inputs[i].name || p.name != inputs[i].name)
        continue;
      const mok_tensor &t = inputs[i].tensor;
      if (t.rank < 1)
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << p.name << ": expected rank " << p.shape.size()
               << " ([T, ...], T its token count), got rank " << t.rank;
      int64_t tokens = t.shape[0];
      if (tokens < 1 || tokens > layer->maxTokens)
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << p.name << ": " << tokens << " tokens (rows); the layer "
               << "takes 1 to max_tokens = " << layer->maxTokens
               << (tokens < 1 && layer->epSize > 1
                       ? " (an expert-parallel rank must launch, the others "
                         "wait for it: pass one token row whose routes are "
                         "all -1)"
                   : tokens < 1 ? " (T = 0 has nothing to compute: the caller "
                                  "returns an empty output without a launch)"
                              : " (its capacity; compile with a larger "
                                "max_tokens)");
      layer->callTokens = tokens;
      return MOK_OK;
    }
    return MOK_OK; // missing: bindInputs names it
  }
  return MOK_OK;
}

/// The pointer of every input and output (by param index) after checking
/// them all; inputs bound to weight views come from the views, not from
/// `inputs`. The named tensors are the inputs and the extra outputs (every
/// output but the first, which is `out`).
static mok_status bindInputs(mok_layer layer, const mok_named_tensor *inputs,
                             size_t count, const mok_tensor *out,
                             std::vector<void *> &pointers) {
  pointers.assign(layer->params.size(), nullptr);
  if (count && !inputs)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "inputs: is NULL";
  if (mok_status s = callTokensOf(layer, inputs, count))
    return s;
  const std::vector<int> &outputs = layer->outputs;
  const std::string &first = layer->params[outputs[0]].name;
  for (size_t i = 0; i < count; ++i) {
    const char *name = inputs[i].name;
    int found = -1;
    bool isOutput = false;
    for (int index : layer->inputs)
      if (name && layer->params[index].name == name)
        found = index;
    for (size_t j = 1; j < outputs.size(); ++j)
      if (name && layer->params[outputs[j]].name == name)
        found = outputs[j], isOutput = true;
    if (found < 0 && name && first == name)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "inputs[" << i << "]: '" << name
             << "' is the layer's first output: pass it as `out`, not among "
                "the named tensors";
    if (found < 0) {
      Fail f(MOK_ERROR_INVALID_ARGUMENT);
      f << "inputs[" << i << "]: unknown ";
      if (outputs.size() == 1)
        return f << "input '" << (name ? name : "(null)") << "'; expected "
                 << nameList(layer, layer->inputs);
      return f << "input or output '" << (name ? name : "(null)")
               << "'; expected the inputs " << nameList(layer, layer->inputs)
               << " and the extra outputs " << nameList(layer, outputs, 1)
               << " (the first output, '" << first << "', is `out`)";
    }
    const char *kind = isOutput ? "outputs: '" : "inputs: '";
    if (layer->views[found].bound)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "inputs: '" << name
             << "' is bound as a weight view (mok_layer_bind_weights); do not "
                "pass it too";
    if (pointers[found])
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << kind << name << "' is given twice";
    const Param &p = layer->params[found];
    if (mok_status s =
            checkDense(&inputs[i].tensor, p, readByTMA(layer, p.name),
                       layer->callTokens))
      return s;
    pointers[found] = inputs[i].tensor.data;
  }
  for (int index : layer->inputs)
    if (layer->views[index].bound)
      pointers[index] = viewPointer(layer->views[index].view);
  for (int index : layer->inputs)
    if (!pointers[index])
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "inputs: '" << layer->params[index].name << "' is missing";
  for (size_t j = 1; j < outputs.size(); ++j)
    if (!pointers[outputs[j]])
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "outputs: '" << layer->params[outputs[j]].name
             << "' is missing (extra outputs are passed among the named "
                "tensors)";
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "out: is NULL";
  const Param &o = layer->params[outputs[0]];
  if (mok_status s =
          checkDense(out, o, readByTMA(layer, o.name), layer->callTokens))
    return s;
  pointers[outputs[0]] = out->data;
  return checkOutputOverlaps(layer, pointers);
}

/// A layer that exchanges (compiled for ep > 1, or for ep = 1 with
/// self-exchange) runs only bound to a communicator of its size
/// (mok_layer_bind_comm).
static mok_status checkGroupSize(mok_layer layer) {
  if (!layer->symmetricBytes || layer->comm)
    return MOK_OK;
  if (layer->epSize == 1)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "layer: compiled to exchange through a symmetric buffer at ep "
              "= 1 (self-exchange), but no communicator is bound (bind one "
              "of 1 rank with mok_layer_bind_comm)";
  return Fail(MOK_ERROR_INVALID_ARGUMENT)
         << "layer: compiled for ep = " << layer->epSize
         << " (expert parallelism), but no communicator is bound (bind one of "
         << layer->epSize << " ranks with mok_layer_bind_comm)";
}

extern "C" mok_status mok_layer_check(mok_layer layer,
                                      const mok_named_tensor *inputs,
                                      size_t count, const mok_tensor *out) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (mok_status s = checkGroupSize(layer))
    return s;
  std::vector<void *> pointers;
  if (mok_status s = bindInputs(layer, inputs, count, out, pointers))
    return s;
  return ok();
}

//===----------------------------------------------------------------------===//
// Loading and running
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_layer_load(mok_layer layer, int device,
                                     const char *ptx) {
  return mok_layer_load_image(layer, device, ptx, nullptr, 0);
}

extern "C" mok_status mok_layer_load_source(mok_layer layer,
                                            mok_load_source *source,
                                            const char **detail) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!source)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "source: is NULL";
  if (!layer->module) {
    *source = MOK_LOAD_NONE;
    if (detail)
      *detail = "";
    return ok();
  }
  return mok_module_load_source(layer->module, source, detail);
}

extern "C" mok_status mok_layer_load_image(mok_layer layer, int device,
                                           const char *ptx, const void *cubin,
                                           size_t cubinSize) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (layer->module)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "layer: is already loaded";
  if (mok_status s = checkGroupSize(layer))
    return s;
  if (layer->comm && layer->comm->device != device)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "device: " << device << ", but the layer's communicator (rank "
           << layer->comm->rank << " of " << layer->comm->size
           << ") is on device " << layer->comm->device;
  int sms = 0;
  if (mok_status s = mok_device_sm_count(device, &sms))
    return s;
  mok_module module = nullptr;
  if (mok_status s =
          mok_module_load_image(device, ptx, cubin, cubinSize, &module))
    return s;
  const Driver *d = module->driver;
  d->ctxSetCurrent(module->context);
  // The workspace is allocated into a local vector and the layer's fields
  // are set only once all of it is: a failed load frees what it allocated
  // and unloads the module, leaving the layer as it was (not loaded, so a
  // later load may try again). (The host tests fail each driver call in
  // turn, against a stand-in driver: runtime/tests/driver_test.cpp.)
  std::vector<CUdeviceptr> workspace(layer->params.size(), 0);
  void *report = nullptr;
  auto undo = [&] {
    for (size_t i = 0; i < workspace.size(); ++i)
      if (workspace[i] && static_cast<int>(i) != layer->statusParam)
        d->memFree(workspace[i]);
    if (report)
      d->memFreeHost(report);
    destroyModule(module); // keeps the failure's message
  };
  if (layer->statusParam >= 0) {
    const Param &p = layer->params[layer->statusParam];
    size_t bytes = static_cast<size_t>(p.elements()) * sizeof(int32_t);
    CUdeviceptr mapped = 0;
    CUresult r = d->memHostAlloc(&report, bytes,
                                 CU_MEMHOSTALLOC_DEVICEMAP |
                                     CU_MEMHOSTALLOC_PORTABLE);
    if (r == CUDA_SUCCESS)
      r = d->memHostGetDevicePointer(&mapped, report, 0);
    if (r != CUDA_SUCCESS) {
      mok_status s =
          Fail(r == CUDA_ERROR_OUT_OF_MEMORY ? MOK_ERROR_OUT_OF_MEMORY
                                             : MOK_ERROR_CUDA)
          << "allocating the kernel's report '" << p.name << "' (" << bytes
          << " bytes of mapped host memory): " << d->describe(r);
      undo();
      return s;
    }
    std::memset(report, 0, bytes);
    workspace[layer->statusParam] = mapped;
  }
  for (size_t i = 0; i < layer->params.size(); ++i) {
    const Param &p = layer->params[i];
    if (p.role != "workspace" && p.role != "tensor_maps")
      continue;
    size_t bytes = static_cast<size_t>(p.elements()) * mok_dtype_size(p.dtype);
    if (!bytes)
      continue;
    if (CUresult r = d->memAlloc(&workspace[i], bytes); r != CUDA_SUCCESS) {
      workspace[i] = 0;
      mok_status s =
          Fail(r == CUDA_ERROR_OUT_OF_MEMORY ? MOK_ERROR_OUT_OF_MEMORY
                                             : MOK_ERROR_CUDA)
          << "allocating the workspace buffer '" << p.name << "' (" << bytes
          << " bytes): " << d->describe(r);
      undo();
      return s;
    }
    for (const std::string &z : layer->zeroFirst)
      if (z == p.name)
        if (CUresult r = d->memsetD8(workspace[i], 0, bytes);
            r != CUDA_SUCCESS) {
          mok_status s = Fail(MOK_ERROR_CUDA)
                         << "zeroing '" << p.name << "': " << d->describe(r);
          undo();
          return s;
        }
  }
  // Persistent: one CTA per multiprocessor (the kernel is compiled so that
  // one fits; a cooperative launch refuses the grid otherwise); with
  // clusters, as many whole clusters as fit at once. (Before the layer's
  // fields are set: a failure here leaves the layer not loaded.)
  // Every CTA of the grid must be resident at once (the grid barriers wait
  // for all of them): the occupancy of the kernel as compiled (its
  // registers, shared memory and block) bounds the grid, and a kernel of
  // which not one CTA fits an SM is refused here, by name, rather than at
  // its first launch.
  int perSM = 0;
  if (mok_status s = mok_module_max_active_blocks(
          module, layer->kernel.c_str(), layer->block, layer->dynamicSmem,
          &perSM)) {
    undo();
    return s;
  }
  if (perSM < 1) {
    undo();
    return Fail(MOK_ERROR_UNSUPPORTED)
           << "metadata: no CTA of '" << layer->kernel << "' (" << layer->block
           << " threads, " << layer->dynamicSmem
           << " bytes of dynamic shared memory) fits on a multiprocessor of "
              "device "
           << device;
  }
  uint32_t grid = static_cast<uint32_t>(sms);
  uint32_t maxGrid = static_cast<uint32_t>(sms) * static_cast<uint32_t>(perSM);
  if (layer->cluster > 1) {
    int clusters = 0;
    if (mok_status s = mok_module_max_active_clusters(
            module, layer->kernel.c_str(), layer->block, layer->cluster,
            layer->dynamicSmem, &clusters)) {
      undo();
      return s;
    }
    uint32_t fit = std::min(static_cast<uint32_t>(sms) / layer->cluster,
                            static_cast<uint32_t>(std::max(clusters, 0)));
    if (fit == 0) {
      undo();
      return Fail(MOK_ERROR_CUDA)
             << "metadata: no cluster of " << layer->cluster
             << " CTAs of the kernel fits on device " << device;
    }
    grid = fit * layer->cluster;
    maxGrid = grid;
  }
  if (layer->gridChosen > maxGrid) {
    undo();
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "grid: " << layer->gridChosen << " CTAs were asked for "
           << "(mok_layer_set_grid), but at most " << maxGrid
           << " fit on device " << device << " at once";
  }
  layer->maxGrid = maxGrid;
  layer->report = static_cast<volatile int32_t *>(report);
  layer->module = module;
  layer->device = device;
  layer->grid = grid;
  layer->workspace = std::move(workspace);
  layer->mapHost.assign(128 * layer->slots + 64, 0);
  return ok();
}

/// Rebuilds the TMA descriptors when what a slot reads moved (a buffer's
/// address, or a newly bound or unbound weight view), and uploads them on
/// `stream`, the stream the forward launches on.
static mok_status updateTensorMaps(mok_layer layer,
                                   const std::vector<void *> &pointers,
                                   CUstream stream) {
  if (layer->maps.empty())
    return MOK_OK;
  std::vector<MapSlot> key;
  key.reserve(layer->slots);
  for (const TensorMapSpec &m : layer->maps) {
    const Binding &b = layer->views[m.param];
    if (b.bound) {
      appendViewSlots(b.view, m.experts, key);
      continue;
    }
    uintptr_t data = pointers[m.param]
                         ? reinterpret_cast<uintptr_t>(pointers[m.param])
                         : static_cast<uintptr_t>(layer->workspace[m.param]);
    appendDenseSlots(data, mok_dtype_size(layer->params[m.param].dtype),
                     m.experts, m.rows, m.rowStride, key);
    // Any T: the map (one slot) ends at the call's rows; a new T is a new
    // map.
    if (m.rowsScale)
      key.back().rows = m.callRows(layer->callTokens);
  }
  const Driver *d = layer->module->driver;
  if (CUresult r = d->ctxSetCurrent(layer->module->context); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult r = d->streamIsCapturing(stream, &capture); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "stream: cuStreamIsCapturing failed: " << d->describe(r);
  bool capturing = capture == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  bool rebuild = capturing || key != layer->mapKey;
  if (!rebuild && layer->captured.empty())
    return MOK_OK;
  std::vector<unsigned char> *host = &layer->mapHost;
  if (capturing) {
    layer->captured.emplace_back(layer->mapHost.size());
    host = &layer->captured.back();
  }
  uintptr_t raw = reinterpret_cast<uintptr_t>(host->data());
  unsigned char *base = host->data() + ((64 - raw % 64) % 64);
  size_t slot = 0;
  for (size_t i = 0; rebuild && i < layer->maps.size(); ++i) {
    const TensorMapSpec &m = layer->maps[i];
    for (int64_t e = 0; e < m.experts; ++e, ++slot)
      if (mok_status s = mok_tma_descriptor_2d_typed(
              base + 128 * slot, reinterpret_cast<void *>(key[slot].address),
              layer->params[m.param].dtype, m.callRows(layer->callTokens), m.cols, key[slot].rowStride,
              static_cast<uint32_t>(m.boxRows),
              static_cast<uint32_t>(m.boxCols))) {
        if (!capturing) // mapHost is half rewritten: rebuild next time
          layer->mapKey.clear();
        Fail f(s);
        f << "tensor map " << i;
        if (m.experts > 1)
          f << " (expert " << e << ")";
        return f << " of '" << m.buffer << "': " << mok_last_error();
      }
  }
  // The upload is ordered on the forward's stream: after the kernels of
  // earlier forwards on it (which may still read the old maps) and before
  // this forward's kernel. A synchronous cuMemcpyHtoD would be ordered only
  // against the legacy default stream, not against a non-blocking stream
  // (torch's side streams). Forwards of one layer on different streams
  // without ordering between them are not supported: they share the maps.
  //
  // The source is mapHost, pageable memory that the next rebuild rewrites.
  // For a copy from pageable memory the driver stages the data in its pinned
  // memory before the call returns (CUDA's "API synchronization behavior";
  // it may first wait for the stream's earlier work to do so), so the
  // buffer may be rewritten afterwards. A pinned buffer would instead be
  // read when the copy runs, racing with the next rebuild.
  //
  // Captured in a CUDA graph, the copy reads its source at every replay
  // (seen on the H200, driver 580): hence the capture's own buffer, never
  // rewritten, and the device copy re-uploaded by every call after a
  // capture (a replay may have left another capture's maps there).
  if (CUresult r = d->memcpyHtoDAsync(layer->workspace[layer->mapStorage], base,
                                      128 * layer->slots, stream);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "copying the tensor maps to the device: " << d->describe(r);
  if (!capturing)
    layer->mapKey = std::move(key);
  return MOK_OK;
}

/// Before an expert-parallel launch: a filled peer table, and a stream that
/// is not being captured (a CUDA graph would replay the launch's epoch, and
/// its kernels would take the flags of an earlier step for this one's).
static mok_status checkExchange(mok_layer layer, CUstream stream) {
  if (mok_status s = checkComplete(layer->exchange, "layer: the exchange buffer"))
    return s;
  const Driver *d = layer->module->driver;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  if (CUresult r = d->streamIsCapturing(stream, &capture); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA)
           << "stream: cuStreamIsCapturing failed: " << d->describe(r);
  // A kernel given its epoch by value would repeat it at every replay; the
  // compiler's count their launches on the device instead.
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE && layer->epochParam >= 0)
    return Fail(MOK_ERROR_UNSUPPORTED)
           << "stream: is being captured into a CUDA graph, but this layer "
              "exchanges tokens (ep = "
           << layer->epSize
           << "): each launch passes its kernel a new epoch, which a replay "
              "would repeat";
  return MOK_OK;
}

extern "C" mok_status mok_layer_forward(mok_layer layer,
                                        const mok_named_tensor *inputs,
                                        size_t count, const mok_tensor *out,
                                        void *stream) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!layer->module)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "layer: not loaded (call mok_layer_load first)";
  if (mok_status s = checkGroupSize(layer))
    return s;
  std::vector<void *> pointers;
  if (mok_status s = bindInputs(layer, inputs, count, out, pointers))
    return s;
  if (layer->exchange)
    if (mok_status s = checkExchange(layer, static_cast<CUstream>(stream)))
      return s;
  if (mok_status s =
          updateTensorMaps(layer, pointers, static_cast<CUstream>(stream)))
    return s;
  // Every parameter is one pointer.
  std::vector<uint64_t> values(layer->params.size());
  std::vector<void *> params(layer->params.size());
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = pointers[i] ? reinterpret_cast<uint64_t>(pointers[i])
                            : static_cast<uint64_t>(layer->workspace[i]);
    params[i] = &values[i];
  }
  // Any T: the call's token count, by value.
  if (layer->tokensParam >= 0)
    values[layer->tokensParam] = static_cast<uint64_t>(layer->callTokens);
  // Expert parallelism: the peer table, this rank and the next epoch (the
  // last two by value; a u32 parameter reads the low half of its word).
  if (layer->exchange) {
    values[layer->peersParam] = static_cast<uint64_t>(layer->exchange->table);
    values[layer->rankParam] = static_cast<uint32_t>(layer->comm->rank);
    if (layer->epochParam >= 0)
      values[layer->epochParam] = layer->epoch + 1;
    values[layer->symmetricParam] =
        static_cast<uint64_t>(layer->exchange->self);
  }
  uint32_t ctas = layer->gridChosen ? layer->gridChosen : layer->grid;
  uint32_t grid[3] = {ctas, 1, 1}, block[3] = {layer->block, 1, 1};
  mok_status launched = mok_module_launch_clusters(
      layer->module, layer->kernel.c_str(), grid, block, layer->cluster,
      layer->dynamicSmem, stream, params.data(),
      layer->cooperative && !layer->oversubscribed ? MOK_LAUNCH_COOPERATIVE
                                                   : 0);
  // A launch that failed ran nothing: the next one passes the same epoch,
  // which the other ranks' kernels of this step wait for.
  if (!launched && layer->exchange)
    ++layer->epoch;
  return launched;
}

//===----------------------------------------------------------------------===//
// Weight views
//===----------------------------------------------------------------------===//

/// Why input `p` cannot take a weight view ("" if it can): views replace a
/// routed expert weight [E, rows, cols] that the kernel reads only through
/// per-expert tensor maps (one slot per expert, so each expert's base and
/// row stride can be the view's). A kernel that dereferences the pointer
/// (the scalar GEMM path) or maps the tensor as a whole needs it dense.
static std::string whyNoView(mok_layer layer, const Param &p) {
  std::string n = "'" + p.name + "': ";
  if (p.shape.size() != 3) {
    std::string shape;
    for (int64_t d : p.shape)
      shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return n +
           "not a routed expert weight operand (weight views stand in "
           "for [E, rows, cols] weights; this input is " +
           mok_dtype_name(p.dtype) + " [" + shape + "])";
  }
  if (!p.tensorMapsOnly)
    return n + "this layer's kernel reads it by pointer (scalar GEMM path); "
               "weight views need a kernel with tensor-core GEMMs (shapes "
               "that fit their tiles); pass a dense tensor instead";
  for (const TensorMapSpec &m : layer->maps)
    if (m.buffer == p.name &&
        (m.experts != p.shape[0] || m.rows > p.shape[1] || m.cols > p.shape[2]))
      return n + "this layer's kernel reads it through a tensor map over the "
                 "whole tensor, not one per expert (metadata without "
                 "per-expert \"experts\" maps); pass a dense tensor instead";
  return "";
}

/// TMA's rules for every slot a view yields: 16-byte aligned expert bases
/// and rows, rows that do not overlap.
static mok_status checkViewForTMA(const mok_expert_weights &w,
                                  const std::string &n) {
  size_t elt = mok_dtype_size(w.dtype);
  if (w.row_stride < w.cols)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": row_stride " << w.row_stride << " is less than cols "
           << w.cols;
  if ((w.row_stride * elt) % 16)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": row_stride must be a multiple of " << 16 / elt
           << " elements (16 bytes, for TMA), got " << w.row_stride;
  if (w.layout == MOK_WEIGHTS_PER_EXPERT) {
    if (!w.expert_pointers)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << n << ": the per-expert pointer table is NULL";
    for (int64_t e = 0; e < w.experts; ++e) {
      uintptr_t a = reinterpret_cast<uintptr_t>(w.expert_pointers[e]);
      if (!a || a % 16)
        return Fail(MOK_ERROR_INVALID_ARGUMENT)
               << n << ": expert " << e << "'s base must be non-NULL and "
               << "16-byte aligned (TMA), got 0x"
               << Hex{static_cast<uint64_t>(a)};
    }
    return MOK_OK;
  }
  uintptr_t a = reinterpret_cast<uintptr_t>(w.base);
  if (!a || a % 16)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": the base (expert 0's) must be non-NULL and 16-byte "
           << "aligned (TMA), got 0x" << Hex{static_cast<uint64_t>(a)};
  // Expert e's base is base + e*expert_stride elements.
  if (w.experts > 1 && (w.expert_stride * elt) % 16)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << n << ": expert_stride must be a multiple of " << 16 / elt
           << " elements (16-byte aligned expert bases, for TMA), got "
           << w.expert_stride;
  return MOK_OK;
}

extern "C" mok_status mok_layer_bind_weights(mok_layer layer, const char *name,
                                             const mok_expert_weights *view) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!name)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "name: is NULL";
  int found = -1;
  for (int index : layer->inputs)
    if (layer->params[index].name == name)
      found = index;
  if (found < 0) {
    std::string expected;
    for (int index : layer->inputs)
      expected += (expected.empty() ? "" : ", ") + layer->params[index].name;
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "name: unknown input '" << name << "'; expected " << expected;
  }
  Binding &binding = layer->views[found];
  // Unbinding an operand that is not bound (any input) changes nothing.
  if (!view) {
    binding = Binding{};
    return ok();
  }
  const Param &p = layer->params[found];
  std::string why = whyNoView(layer, p);
  if (!why.empty())
    return fail(MOK_ERROR_INVALID_ARGUMENT, why);
  std::string n = "'" + p.name + "'";
  if (mok_status s = mok_weights_check(view, n.c_str(), p.dtype, p.shape[0],
                                       p.shape[1], p.shape[2]))
    return s;
  if (mok_status s = checkViewForTMA(*view, n))
    return s;
  // Only now replace the binding: a refused view leaves the previous one.
  Binding next;
  next.bound = true;
  next.view = *view;
  if (view->layout == MOK_WEIGHTS_PER_EXPERT) {
    next.table.assign(view->expert_pointers,
                      view->expert_pointers + view->experts);
    next.view.expert_pointers = next.table.data();
  } else {
    next.view.expert_pointers = nullptr;
  }
  // The table's heap storage moves with the vector, so the pointer into it
  // stays valid.
  binding = std::move(next);
  return ok();
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_layer_set_ep_group(mok_layer layer,
                                             const mok_ep_group *group) {
  if (mok_status s = checkLayer(layer))
    return s;
  const mok_ep_group defaultGroup{1, 0, nullptr};
  const mok_ep_group &g = group ? *group : defaultGroup;
  if (mok_status s = checkEpGroup(&g))
    return s;
  if (g.size > 1)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ep_group: size " << g.size
           << ": a layer joins an expert-parallel group through a "
              "communicator (mok_comm_create or mok_comm_adopt, then "
              "mok_layer_bind_comm); mok_layer_set_ep_group sets size 1 only";
  if (g.size != layer->epSize)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ep_group: size " << g.size << ", but this layer was compiled "
           << "for ep = " << layer->epSize
           << " (the metadata's \"ep\"); the group's size must be the "
              "compiled one: bind a communicator of "
           << layer->epSize << " ranks with mok_layer_bind_comm";
  if (layer->comm)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ep_group: a communicator is bound (mok_layer_bind_comm) and is "
              "the layer's group; unbind it first";
  layer->group = g;
  return ok();
}

extern "C" mok_status mok_layer_ep_group(mok_layer layer, mok_ep_group *group) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!group)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "group: is NULL";
  if (layer->comm)
    *group = mok_ep_group{layer->comm->size, layer->comm->rank,
                          layer->comm->ncclComm};
  else
    *group = layer->group;
  return ok();
}

extern "C" mok_status mok_layer_ep_size(mok_layer layer, int32_t *size) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!size)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "size: is NULL";
  *size = layer->epSize;
  return ok();
}

extern "C" mok_status mok_layer_symmetric_bytes(mok_layer layer,
                                                size_t *bytes) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!bytes)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "bytes: is NULL";
  *bytes = static_cast<size_t>(layer->symmetricBytes);
  return ok();
}

extern "C" mok_status mok_layer_bind_comm(mok_layer layer, mok_comm comm,
                                          mok_symmetric buffer) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!comm && !buffer) {
    if (mok_status s = releaseComm(layer))
      return s;
    return ok();
  }
  if (buffer) {
    if (mok_status s = checkSymmetric(buffer))
      return s;
    if (!comm)
      comm = buffer->comm;
  }
  if (mok_status s = checkComm(comm))
    return s;
  if (buffer && buffer->comm != comm)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "buffer: a symmetric buffer of another communicator (rank "
           << buffer->comm->rank << " of " << buffer->comm->size
           << "), not of `comm` (rank " << comm->rank << " of " << comm->size
           << ")";
  // The binding already in place changes nothing (its epoch goes on).
  if (comm == layer->comm && (!buffer || buffer == layer->exchange))
    return ok();
  if (comm->size != layer->epSize)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "comm: a communicator of " << comm->size
           << " rank(s), but this layer was compiled for ep = "
           << layer->epSize << " (the metadata's \"ep\"): bind one of "
           << layer->epSize << " rank(s)";
  if (layer->module && comm->device != layer->device)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "comm: on device " << comm->device
           << ", but the layer is loaded on device " << layer->device;
  if (!layer->symmetricBytes) {
    if (buffer)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "buffer: this layer was compiled for ep = 1 and exchanges "
                "nothing: it takes no symmetric buffer";
    if (mok_status s = releaseComm(layer))
      return s;
    layer->comm = comm;
    countBinding(comm, +1);
    return ok();
  }
  // Every rank binds the same layer (checked after this rank's own
  // argument checks, before any buffer is allocated or reset: a refusal
  // leaves every rank as it was).
  if (buffer) {
    if (buffer->bytes < layer->symmetricBytes)
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "buffer: " << buffer->bytes
             << " bytes, but this layer's exchange needs symmetric_bytes = "
             << layer->symmetricBytes;
    if (buffer->layerOwned || (buffer->user && buffer->user != layer))
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "buffer: another layer uses it already; each layer needs an "
                "exchange buffer of its own (its epochs and signal flags are "
                "its own)";
    if (mok_status s = checkComplete(buffer, "buffer"))
      return s;
    if (mok_status s = checkSameLayer(comm, layer->fingerprint,
                                      layer->symmetricBytes))
      return s;
    if (mok_status s = resetForLayer(buffer, layer->symmetricBytes))
      return s;
  } else {
    if (mok_status s = checkSameLayer(comm, layer->fingerprint,
                                      layer->symmetricBytes))
      return s;
    if (mok_status s = allocSymmetric(comm, layer->symmetricBytes,
                                      /*layerOwned=*/true, buffer))
      return s;
  }
  // Only now let the previous binding go: a refused one leaves it.
  if (mok_status s = releaseComm(layer)) {
    (void)s; // the old buffer failed to free; the new binding stands
  }
  layer->comm = comm;
  layer->exchange = buffer;
  layer->ownsExchange = buffer->layerOwned;
  buffer->user = layer;
  countBinding(comm, +1);
  return ok();
}

extern "C" mok_status mok_layer_comm(mok_layer layer, mok_comm *comm,
                                     mok_symmetric *buffer) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (comm)
    *comm = layer->comm;
  if (buffer)
    *buffer = layer->exchange;
  return ok();
}

extern "C" mok_status mok_layer_epoch(mok_layer layer, uint64_t *epoch) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!epoch)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "epoch: is NULL";
  *epoch = layer->epoch;
  return ok();
}

//===----------------------------------------------------------------------===//
// Reading the workspace back
//===----------------------------------------------------------------------===//

/// What param `index` is, in a sentence ("'x' is <this>").
static const char *roleWords(mok_layer layer, int index) {
  const std::string &role = layer->params[index].role;
  if (role == "input")
    return "an input";
  if (role == "output")
    return index == layer->outputs[0] ? "the output" : "an extra output";
  if (role == "tensor_maps")
    return "the tensor-map storage (role tensor_maps)";
  return "not a workspace buffer";
}

/// The index of the workspace buffer `name` (role "workspace"), or an error
/// naming it that lists the layer's workspace buffers.
static mok_status findWorkspace(mok_layer layer, const char *name, int &index) {
  std::string list;
  for (const Param &p : layer->params)
    if (p.role == "workspace")
      list += (list.empty() ? "" : ", ") + p.name;
  std::string known =
      list.empty() ? "this layer has none" : "workspace buffers: " + list;
  for (size_t i = 0; i < layer->params.size(); ++i) {
    const Param &p = layer->params[i];
    if (p.name != name)
      continue;
    if (p.role != "workspace")
      return Fail(MOK_ERROR_INVALID_ARGUMENT)
             << "name: '" << name << "' is "
             << roleWords(layer, static_cast<int>(i))
             << ", not a workspace buffer (" << known << ")";
    index = static_cast<int>(i);
    return MOK_OK;
  }
  return Fail(MOK_ERROR_INVALID_ARGUMENT)
         << "name: unknown workspace buffer '" << name << "' (" << known << ")";
}

static size_t byteSize(const Param &p) {
  return static_cast<size_t>(p.elements()) * mok_dtype_size(p.dtype);
}

/// The arguments of the workspace entry points, checked in order (layer,
/// name, the out pointer `what`), then the buffer named `name`.
static mok_status lookupWorkspace(mok_layer layer, const char *name,
                                  const void *out, const char *what,
                                  int &index) {
  if (mok_status s = checkLayer(layer))
    return s;
  if (!name)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "name: is NULL";
  if (!out)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << what << ": is NULL";
  return findWorkspace(layer, name, index);
}

extern "C" mok_status
mok_layer_workspace_size(mok_layer layer, const char *name, size_t *bytes) {
  int index = -1;
  if (mok_status s = lookupWorkspace(layer, name, bytes, "bytes", index))
    return s;
  *bytes = byteSize(layer->params[index]);
  return ok();
}

extern "C" mok_status mok_layer_read_workspace(mok_layer layer,
                                               const char *name, void *host,
                                               size_t bytes) {
  int index = -1;
  if (mok_status s = lookupWorkspace(layer, name, host, "host", index))
    return s;
  const Param &p = layer->params[index];
  size_t size = byteSize(p);
  if (bytes != size) {
    Fail f(MOK_ERROR_INVALID_ARGUMENT);
    f << "bytes: expected " << size << ", the size of '" << p.name << "' ("
      << mok_dtype_name(p.dtype) << " [";
    for (size_t d = 0; d < p.shape.size(); ++d)
      f << (d ? ", " : "") << p.shape[d];
    return f << "]), got " << bytes;
  }
  if (!layer->module)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "layer: not loaded (call mok_layer_load first)";
  if (!size) // nothing was allocated for an empty buffer
    return ok();
  const Driver *d = layer->module->driver;
  if (CUresult r = d->ctxSetCurrent(layer->module->context); r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "cuCtxSetCurrent: " << d->describe(r);
  if (CUresult r = d->memcpyDtoH(host, layer->workspace[index], size);
      r != CUDA_SUCCESS)
    return Fail(MOK_ERROR_CUDA) << "copying the workspace buffer '" << p.name
                                << "' to the host: " << d->describe(r);
  return ok();
}

//===----------------------------------------------------------------------===//
// The kernels' report and the grid
//===----------------------------------------------------------------------===//

extern "C" mok_status mok_layer_take_report(mok_layer layer, void *stream,
                                            int wait,
                                            mok_kernel_report *report) {
  if (report)
    *report = mok_kernel_report{};
  if (!layer)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "layer: is NULL";
  if (!layer->module)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "layer: not loaded (call mok_layer_load first)";
  if (!layer->report)
    return MOK_OK;
  const Driver *d = layer->module->driver;
  d->ctxSetCurrent(layer->module->context);
  // A stream being captured into a CUDA graph has run nothing to wait for
  // (and may not be synchronized): only what finished launches wrote.
  if (wait) {
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d->streamIsCapturing(static_cast<CUstream>(stream), &capture) ==
            CUDA_SUCCESS &&
        capture != CU_STREAM_CAPTURE_STATUS_NONE)
      wait = 0;
  }
  if (wait)
    if (CUresult r = d->streamSynchronize(static_cast<CUstream>(stream));
        r != CUDA_SUCCESS)
      return Fail(MOK_ERROR_CUDA)
             << "stream: synchronizing before reading the kernel's report: "
             << d->describe(r);
  volatile int32_t *w = layer->report;
  mok_kernel_report got{};
  // status[0]: 1 a bad expert id (status[1] the id, status[2] its
  // route), 2 a receive capacity exceeded (status[1] the rank, status[2]
  // its routes).
  got.bad_routes = w[0] == 1;
  got.bad_expert_id = w[0] == 1 ? w[1] : 0;
  got.bad_route = w[0] == 1 ? w[2] : 0;
  got.capacity_exceeded = w[0] == 2;
  got.capacity_rank = w[0] == 2 ? w[1] : 0;
  got.capacity_routes = w[0] == 2 ? w[2] : 0;
  got.barrier_timed_out = w[3] != 0;
  got.barrier_index = w[3] - 1;
  got.exchange_wait = w[3] != 0 && w[7] == 1;
  got.barrier_arrived = got.exchange_wait ? 0 : w[4];
  got.barrier_grid = got.exchange_wait ? 0 : w[5];
  got.barrier_cta = w[6];
  got.wait_rank = got.exchange_wait ? w[4] : 0;
  got.wait_step = got.exchange_wait ? w[5] : 0;
  if (!got.bad_routes && !got.barrier_timed_out && !got.capacity_exceeded)
    return MOK_OK;
  if (report)
    *report = got;
  for (int i = 0; i < 8; ++i)
    w[i] = 0;
  if (got.barrier_timed_out) {
    // The barrier's count and generation are whatever the CTAs that gave
    // up left: start the next launch from zero (after this one ended).
    int bar = -1;
    for (size_t i = 0; i < layer->params.size(); ++i)
      if (layer->params[i].name == "grid_barrier")
        bar = static_cast<int>(i);
    CUresult r = d->streamSynchronize(static_cast<CUstream>(stream));
    if (r == CUDA_SUCCESS && bar >= 0)
      r = d->memsetD8(layer->workspace[bar], 0,
                      static_cast<size_t>(layer->params[bar].elements()) *
                          mok_dtype_size(layer->params[bar].dtype));
    Fail f(MOK_ERROR_TIMEOUT);
    static const char *steps[] = {"counts", "rows", "results"};
    if (got.exchange_wait)
      f << "kernel '" << layer->kernel << "': the exchange's wait "
        << got.barrier_index << " (for the "
        << (got.wait_step >= 0 && got.wait_step < 3 ? steps[got.wait_step]
                                                   : "?")
        << ") waited longer than its bound (barrier-timeout-ms): rank "
        << got.wait_rank
        << " had not signalled (did every rank launch this layer?; CTA "
        << got.barrier_cta
        << " gave up); the kernel ended early and its results are not "
           "defined";
    else
      f << "kernel '" << layer->kernel << "': grid barrier "
        << got.barrier_index << " waited longer than its bound "
        << "(barrier-timeout-ms) with " << got.barrier_arrived << " of "
        << got.barrier_grid << " CTAs arrived (CTA " << got.barrier_cta
        << " gave up); the kernel ended early and its results are not defined";
    if (r != CUDA_SUCCESS)
      f << "; resetting the barrier failed: " << d->describe(r);
    return f;
  }
  if (got.capacity_exceeded)
    return Fail(MOK_ERROR_BAD_ROUTING)
           << "top_experts: the routes sent to rank " << got.capacity_rank
           << "'s experts (" << got.capacity_routes
           << ", from all ranks) exceed the receive capacity recv_capacity = "
           << layer->recvCapacity
           << " (LayerSpec.recv_capacity): no rank of the group exchanged a "
              "row, and this call's outputs are NaN";
  int64_t k = 1;
  for (int i : layer->inputs)
    if (layer->params[i].name == "top_experts" &&
        layer->params[i].shape.size() == 2)
      k = std::max<int64_t>(1, layer->params[i].shape[1]);
  return Fail(MOK_ERROR_BAD_ROUTING)
         << "top_experts: an expert id outside [-1, E) was routed (id "
         << got.bad_expert_id << " at route " << got.bad_route << ": token "
         << got.bad_route / k << ", slot " << got.bad_route % k
         << "); the kernel dropped such routes (no expert output, a zero "
            "router-weight gradient), so the results are those of -1 routes "
            "there";
}

extern "C" mok_status mok_layer_set_grid(mok_layer layer, uint32_t ctas) {
  if (!layer)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "layer: is NULL";
  if (ctas % layer->cluster)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ctas: " << ctas << " is not a multiple of the kernel's cluster "
           << "of " << layer->cluster << " CTAs";
  // The testing hook: the bounded barriers' tests need CTAs that cannot
  // all be resident (docs/Reliability.md); never for real work.
  const char *testing = std::getenv("MOK_TESTING_OVERSUBSCRIBE");
  bool oversubscribe = testing && std::string(testing) == "1";
  if (layer->module && ctas > layer->maxGrid && oversubscribe) {
    layer->gridChosen = ctas;
    layer->oversubscribed = true;
    return MOK_OK;
  }
  layer->oversubscribed = false;
  if (layer->module && ctas > layer->maxGrid)
    return Fail(MOK_ERROR_INVALID_ARGUMENT)
           << "ctas: " << ctas << " CTAs cannot be resident at once; at most "
           << layer->maxGrid << " of '" << layer->kernel << "' fit on device "
           << layer->device;
  layer->gridChosen = ctas;
  return MOK_OK;
}

extern "C" mok_status mok_layer_grid(mok_layer layer, uint32_t *ctas,
                                     uint32_t *maxCtas) {
  if (!layer)
    return Fail(MOK_ERROR_INVALID_ARGUMENT) << "layer: is NULL";
  if (ctas)
    *ctas = layer->gridChosen ? layer->gridChosen : layer->grid;
  if (maxCtas)
    *maxCtas = layer->module ? layer->maxGrid : 0;
  return MOK_OK;
}
