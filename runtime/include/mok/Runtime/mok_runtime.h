/* SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception */
/*
 * mok runtime: the C API a trainer embeds. It loads what the mok compiler
 * emits (PTX + metadata), checks every argument, and launches on the
 * caller's stream. It never links MLIR, and it loads the CUDA driver with
 * dlopen, so it builds — and its checks run — on machines without a GPU.
 *
 * Every function returns a mok_status; on failure, mok_last_error() holds a
 * message for this thread naming the argument and what was expected.
 *
 * Handles (mok_module, mok_layer) are checked against a registry of the
 * live ones before use: NULL, a destroyed handle or a pointer that was never
 * one is refused with MOK_ERROR_INVALID_ARGUMENT naming it ("layer: 0x...
 * is not a live mok_layer (destroyed already, or not made by
 * mok_layer_create)"), never dereferenced. Destroying a handle twice is
 * harmless: the second destroy frees nothing and says so in
 * mok_last_error(). (The registry knows addresses: once a later create
 * reuses a destroyed handle's address, the old handle names the new object.)
 */
#ifndef MOK_RUNTIME_H
#define MOK_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MOK_RUNTIME_BUILDING)
#define MOK_API __attribute__((visibility("default")))
#else
#define MOK_API
#endif

#define MOK_RUNTIME_API_VERSION 1
#define MOK_MAX_RANK 4

typedef enum mok_status {
  MOK_OK = 0,
  MOK_ERROR_INVALID_ARGUMENT = 1, /* a shape, dtype, stride, alignment... */
  MOK_ERROR_DRIVER_UNAVAILABLE = 2, /* no libcuda, or no device */
  MOK_ERROR_CUDA = 3,               /* a driver call failed */
  MOK_ERROR_UNSUPPORTED = 4,        /* a feature not implemented yet */
  MOK_ERROR_OUT_OF_MEMORY = 6,
  MOK_ERROR_BAD_ROUTING = 7, /* a kernel found expert ids outside [-1, E) */
  MOK_ERROR_TIMEOUT = 8,     /* a bounded grid barrier timed out */
  MOK_ERROR_NCCL = 9,        /* an NCCL call failed */
  MOK_ERROR_NCCL_UNAVAILABLE = 10, /* no NCCL, or one too old */
} mok_status;

/* The message of the last failing call on this thread ("" if none). */
MOK_API const char *mok_last_error(void);
MOK_API const char *mok_status_name(mok_status status);

/*---------------------------------------------------------------------------
 * Tensors: caller-owned device memory, described, never copied.
 *-------------------------------------------------------------------------*/

typedef enum mok_dtype {
  MOK_DTYPE_BF16 = 1,
  MOK_DTYPE_F32 = 2,
  MOK_DTYPE_I32 = 3,
  MOK_DTYPE_I64 = 4,
  /* Bytes: an expert-parallel kernel's symmetric buffer (param role
   * "symmetric"), never a caller's tensor. */
  MOK_DTYPE_U8 = 5,
  /* FP8 E4M3, the "fn" encoding (OCP OFP8: no infinities, S.1111.111 is
   * NaN, largest finite 448), one byte: an FP8 layer's quantized values. */
  MOK_DTYPE_F8E4M3 = 6,
} mok_dtype;

typedef struct mok_tensor {
  void *data;
  mok_dtype dtype;
  int32_t rank;
  int64_t shape[MOK_MAX_RANK];
  int64_t strides[MOK_MAX_RANK]; /* in elements */
} mok_tensor;

/* A row-major contiguous tensor (convenience for C callers). */
MOK_API mok_tensor mok_tensor_contiguous(void *data, mok_dtype dtype, int32_t rank,
                                 const int64_t *shape);
MOK_API const char *mok_dtype_name(mok_dtype dtype);
MOK_API size_t mok_dtype_size(mok_dtype dtype);

/* Checks `t` (named `name` in messages) against an expected dtype and shape
 * (-1 = any size), contiguity of the innermost dimension and 16-byte
 * alignment of the data and of every outer stride, as TMA needs. */
MOK_API mok_status mok_tensor_check(const mok_tensor *t, const char *name,
                            mok_dtype dtype, int32_t rank,
                            const int64_t *shape);

/*---------------------------------------------------------------------------
 * Weight views: one routed projection of every local expert, [E, rows, cols]
 * (rows = output features, cols = input features, cols contiguous), over
 * trainer-owned storage, without a copy.
 *-------------------------------------------------------------------------*/

typedef enum mok_weight_layout {
  /* base + e*expert_stride + r*row_stride + c; covers one [E, rows, cols]
   * tensor and row slices of a fused tensor (gate/up halves of FC1). */
  MOK_WEIGHTS_STRIDED = 1,
  /* expert_pointers[e] + r*row_stride + c: one allocation per expert. The
   * pointer table is host memory, read when the view is bound. */
  MOK_WEIGHTS_PER_EXPERT = 2,
} mok_weight_layout;

typedef struct mok_expert_weights {
  mok_weight_layout layout;
  mok_dtype dtype;
  int64_t experts, rows, cols;
  void *base;
  int64_t expert_stride; /* elements; MOK_WEIGHTS_STRIDED only */
  int64_t row_stride;    /* elements */
  void *const *expert_pointers; /* MOK_WEIGHTS_PER_EXPERT only */
} mok_expert_weights;

/* A view of a [E, rows, cols] tensor. */
MOK_API mok_status mok_weights_from_tensor(const mok_tensor *t, const char *name,
                                   mok_expert_weights *out);
/* Gate and up views of a fused FC1 tensor [E, 2*I, cols]: gate is rows
 * [0, I) of each expert, up rows [I, 2I). */
MOK_API mok_status mok_weights_split_fc1(const mok_tensor *fc1, const char *name,
                                 mok_expert_weights *gate,
                                 mok_expert_weights *up);
/* A view over one [rows, cols] allocation per expert. */
MOK_API mok_status mok_weights_per_expert(void *const *expert_pointers,
                                  int64_t experts, int64_t rows, int64_t cols,
                                  int64_t row_stride, mok_dtype dtype,
                                  const char *name, mok_expert_weights *out);
/* The address of element (expert, row, col) of a view. */
MOK_API mok_status mok_weights_element_address(const mok_expert_weights *w,
                                        int64_t expert, int64_t row,
                                        int64_t col, uintptr_t *address);
/* Checks a view against the expected dtype and sizes (-1 = any). */
MOK_API mok_status mok_weights_check(const mok_expert_weights *w, const char *name,
                             mok_dtype dtype, int64_t experts, int64_t rows,
                             int64_t cols);

/*---------------------------------------------------------------------------
 * Expert parallelism: a layer compiled for ep = N > 1 runs on N ranks, one
 * GPU each, bound to a communicator of N ranks (mok_layer_bind_comm). Its
 * kernels exchange tokens by storing into each other's symmetric buffers
 * (docs/Runtime.md, "Expert parallelism: communicators and symmetric
 * buffers").
 *-------------------------------------------------------------------------*/

typedef struct mok_ep_group {
  int32_t size; /* 1: no expert parallelism */
  int32_t rank;
  void *nccl_comm; /* ncclComm_t for size > 1 */
} mok_ep_group;

/* Checks a group: 0 <= rank < size, and a communicator when size > 1
 * (MOK_ERROR_INVALID_ARGUMENT). A layer reports its group with
 * mok_layer_ep_group; a group of size > 1 reaches a layer as a
 * communicator (mok_comm_adopt, mok_layer_bind_comm). */
MOK_API mok_status mok_ep_group_check(const mok_ep_group *group);

/* NCCL, loaded at run time (dlopen) on the first call that needs it:
 * `library` names its file (NULL: $MOK_NCCL_LIBRARY, else libnccl.so.2).
 * Gives its NCCL_VERSION_CODE (22809 for 2.28.9) and the file it was
 * loaded from (owned by the runtime); either may be NULL.
 * MOK_ERROR_NCCL_UNAVAILABLE, naming the file and why, when it cannot be
 * loaded, lacks an entry point, or is older than 2.28; a failed load leaves
 * nothing loaded, so another library may be tried. Once loaded, a `library`
 * that is another file is refused (MOK_ERROR_INVALID_ARGUMENT): a
 * communicator belongs to the library that made it, so a process that
 * adopts torch's communicators loads torch's NCCL. */
MOK_API mok_status mok_nccl_load(const char *library, int *version,
                                 const char **path);

typedef struct mok_comm_s *mok_comm;
typedef struct mok_symmetric_s *mok_symmetric;

#define MOK_UNIQUE_ID_BYTES 128
/* An NCCL unique id (ncclUniqueId): made on one rank, sent to the others by
 * the trainer (a broadcast over its own channel). */
typedef struct mok_unique_id {
  char bytes[MOK_UNIQUE_ID_BYTES];
} mok_unique_id;

/* A new unique id (ncclGetUniqueId), on the rank that starts a group. */
MOK_API mok_status mok_comm_get_unique_id(mok_unique_id *id);
/* A communicator of `nranks` ranks on CUDA `device`, this process being
 * `rank` (ncclCommInitRank: every rank calls it with the same id; it
 * returns when all have). An id of zeros is refused by name before NCCL;
 * NCCL's errors (an id no rank 0 made, ...) are MOK_ERROR_NCCL with NCCL's
 * message. mok_comm_destroy finalizes and destroys the NCCL communicator. */
MOK_API mok_status mok_comm_create(const mok_unique_id *id, int nranks,
                                   int rank, int device, mok_comm *out);
/* A communicator over an existing ncclComm_t (torch's ProcessGroupNCCL's,
 * ...), which stays its owner's: mok_comm_destroy does not destroy it, and
 * it must outlive the mok_comm. `device`: the CUDA device it was made on
 * (ncclCommCuDevice), or -1 for that one; another is refused. The NCCL
 * library loaded must be the one that made it (mok_nccl_load). */
MOK_API mok_status mok_comm_adopt(void *nccl_comm, int device, mok_comm *out);
/* `n` communicators of one group in this process, on one GPU, without
 * NCCL: comms[r] is rank r of n. Their symmetric buffers are ordinary
 * device allocations, and each rank's peer table holds the other ranks'
 * buffers, so n layers bound to them run the exchange on one GPU (the
 * loopback group of the tests; launch their kernels concurrently, each on
 * its own stream with a grid of at most 1/n of the multiprocessors
 * (mok_layer_set_grid), so that all are resident at once). Symmetric
 * buffers pair up by order: the k-th allocation of each rank is one
 * symmetric buffer of the group, and its peer tables are filled when the
 * last rank has made it (mok_symmetric_info: `complete`). */
MOK_API mok_status mok_comm_create_local_group(int n, int device,
                                               mok_comm *comms);
/* Destroys a communicator: finalizes and destroys an NCCL communicator it
 * made (not an adopted one), releases its context. Refused while a layer
 * is bound to it or a symmetric buffer of it is live (MOK_ERROR_INVALID_
 * ARGUMENT naming them): unbind and free those first. NULL is a no-op. A
 * destroyed (or unknown) handle is refused by name. */
MOK_API mok_status mok_comm_destroy(mok_comm comm);
MOK_API mok_status mok_comm_size(mok_comm comm, int *size);
MOK_API mok_status mok_comm_rank(mok_comm comm, int *rank);
MOK_API mok_status mok_comm_device(mok_comm comm, int *device);
/* The ncclComm_t (NULL for a local group's). */
MOK_API mok_status mok_comm_nccl(mok_comm comm, void **nccl_comm);

/* A symmetric buffer of `bytes` (>= 1) on every rank of `comm`, zeroed:
 * collective, every rank calls it with the same size, in the same order
 * as its other collective calls on the communicator. With NCCL: ncclMemAlloc
 * and ncclCommWindowRegister (NCCL_WIN_COLL_SYMMETRIC); the ranks first
 * compare their sizes and outcomes (an allgather), so a size that differs
 * between ranks, or an allocation that failed on some rank, fails on every
 * rank by name instead of hanging. Every rank must reach every other over
 * NVLink (NCCL's LSA team is the whole communicator), else MOK_ERROR_
 * UNSUPPORTED. Its peer table is a device array of `size` uint64: entry i
 * is rank i's buffer as this rank's kernels address it (NCCL's LSA
 * address; entry `rank` maps this rank's own memory). For a local group
 * see mok_comm_create_local_group. Free with mok_symmetric_free, on every
 * rank. */
MOK_API mok_status mok_comm_alloc_symmetric(mok_comm comm, size_t bytes,
                                            mok_symmetric *out);
/* Frees a symmetric buffer (deregisters its window, frees its memory; a
 * local group's memory goes when every rank has freed its part). Refused
 * for a buffer a layer uses (the layer's own, or one given to
 * mok_layer_bind_comm). NULL is a no-op. */
MOK_API mok_status mok_symmetric_free(mok_symmetric buffer);

typedef struct mok_symmetric_info {
  void *address;    /* this rank's buffer */
  size_t bytes;
  void *peer_table; /* device array of `ranks` uint64 */
  int32_t ranks, rank;
  int32_t complete; /* 0 while a local group's peer table waits for ranks */
  mok_comm comm;
} mok_symmetric_info;

MOK_API mok_status mok_symmetric_get_info(mok_symmetric buffer,
                                          mok_symmetric_info *info);
/* Copies the peer table from the device (cuMemcpyDtoH, synchronously) into
 * `entries`, which holds `count` == the communicator's size uint64. */
MOK_API mok_status mok_symmetric_read_peers(mok_symmetric buffer,
                                            uint64_t *entries, size_t count);

/*---------------------------------------------------------------------------
 * The CUDA driver and compiled modules
 *-------------------------------------------------------------------------*/

/* Whether the CUDA driver could be loaded (MOK_CUDA_DRIVER overrides the
 * library, default libcuda.so.1) and how many devices it sees. Never fails:
 * *available = 0 with the reason in mok_last_error() when there is none. */
MOK_API mok_status mok_driver_probe(int *available, int *device_count);

typedef struct mok_module_s *mok_module;

/* Where a loaded module's machine code came from. The values are stable
 * (2 is not assigned). */
typedef enum mok_load_source {
  MOK_LOAD_NONE = 0,  /* not loaded */
  MOK_LOAD_CUBIN = 1, /* the cubin the caller gave: no JIT */
  MOK_LOAD_PTX = 3,   /* the PTX, through the driver's JIT (and its cache) */
} mok_load_source;

/* Loads PTX (NUL-terminated) for `device` into its primary context, with the
 * JIT's error log in the message on failure: mok_module_load_image without
 * a cubin. */
MOK_API mok_status mok_module_load_ptx(int device, const char *ptx, mok_module *out);
/* Loads a module for `device` into its primary context from `cubin` (an ELF
 * image of machine code, as ptxas writes it, `cubin_size` bytes; NULL and 0
 * for none) or from `ptx` (NUL-terminated; NULL or "" for none), at least
 * one of them:
 *   1. the cubin, when one is given and the driver takes it for the
 *      device (cuModuleLoadData): no JIT;
 *   2. else the PTX, compiled by the driver (cuModuleLoadDataEx), whose
 *      machine code the driver's own JIT cache keeps for later loads of the
 *      same PTX (CUDA_CACHE_PATH, CUDA_CACHE_MAXSIZE, CUDA_CACHE_DISABLE).
 * A cubin that is not a whole CUDA ELF image (checked before the driver
 * reads it), or that the driver refuses (another chip, a driver too old for
 * it), falls back to the PTX; without PTX that is an error
 * (MOK_ERROR_INVALID_ARGUMENT, MOK_ERROR_CUDA). Beside PTX that declares its
 * dynamic shared memory aligned to N > 16 bytes (`.extern .shared .align
 * N`), a cubin in which some kernel's static shared memory (after which the
 * dynamic one starts) is not a multiple of N bytes falls back to the PTX
 * too (a cubin linked from relocatable code, whose kernels would read
 * misplaced tiles); a cubin alone is not checked so, since it does not
 * record N. mok_module_load_source says which was used and why. */
MOK_API mok_status mok_module_load_image(int device, const char *ptx,
                                         const void *cubin, size_t cubin_size,
                                         mok_module *out);
/* How `module` was loaded (*source) and, if `detail` is not NULL, a sentence
 * saying so: the JIT's time, why a given cubin was not used (owned by the
 * module, valid until it is destroyed). */
MOK_API mok_status mok_module_load_source(mok_module module,
                                          mok_load_source *source,
                                          const char **detail);

/* Unloads the module and releases its context. NULL is a no-op; both clear
 * mok_last_error(). A destroyed (or unknown) handle is refused: nothing is
 * freed, and mok_last_error() names it. */
MOK_API void mok_module_destroy(mok_module module);

/* The number of multiprocessors of `device` (the persistent grid size). */
MOK_API mok_status mok_device_sm_count(int device, int *count);

enum {
  /* All CTAs are resident at once (cuLaunchCooperativeKernel): what a
   * persistent kernel with grid-wide barriers needs. */
  MOK_LAUNCH_COOPERATIVE = 1,
};

/* Launches `kernel` with raw parameters (as cuLaunchKernel takes them);
 * `dynamic_smem` above 48 KiB is opted into first. `stream` is a CUstream
 * (NULL = the legacy default stream); `flags` are MOK_LAUNCH_* bits. */
MOK_API mok_status mok_module_launch(mok_module module, const char *kernel,
                             const uint32_t grid[3], const uint32_t block[3],
                             uint32_t dynamic_smem, void *stream,
                             void **params, uint32_t flags);

/* mok_module_launch in thread-block clusters of `cluster` CTAs along x
 * (cuLaunchKernelEx; 1 = no clusters): grid[0] must be a multiple of it.
 * With MOK_LAUNCH_COOPERATIVE every cluster is resident at once. */
MOK_API mok_status mok_module_launch_clusters(mok_module module,
                             const char *kernel, const uint32_t grid[3],
                             const uint32_t block[3], uint32_t cluster,
                             uint32_t dynamic_smem, void *stream,
                             void **params, uint32_t flags);

/* How many clusters of `cluster` CTAs (of `block` threads and
 * `dynamic_smem` bytes each) of `kernel` can be resident at once
 * (cuOccupancyMaxActiveClusters), in *count. */
MOK_API mok_status mok_module_max_active_clusters(mok_module module,
                             const char *kernel, uint32_t block,
                             uint32_t cluster, uint32_t dynamic_smem,
                             int *count);

/* How many CTAs of `kernel` (of `block` threads and `dynamic_smem` bytes
 * each) can be resident on one multiprocessor at once
 * (cuOccupancyMaxActiveBlocksPerMultiprocessor), in *per_multiprocessor. */
MOK_API mok_status mok_module_max_active_blocks(mok_module module,
                             const char *kernel, uint32_t block,
                             uint32_t dynamic_smem, int *per_multiprocessor);

/* A 2-D TMA descriptor (CUtensorMap, 128 bytes) of a row-major bf16 matrix
 * [rows, cols] with `row_stride` elements between rows, a box of
 * [box_rows, box_cols] and 128-byte swizzle, written to `descriptor`. */
MOK_API mok_status mok_tma_descriptor_2d(void *descriptor, void *data, int64_t rows,
                                 int64_t cols, int64_t row_stride,
                                 uint32_t box_rows, uint32_t box_cols);

/* The same of a matrix of `dtype` elements: MOK_DTYPE_BF16 or
 * MOK_DTYPE_F8E4M3 (encoded as bytes: TMA copies FP8 unchanged). A box row
 * holds at most 128 bytes: 64 bf16 or 128 FP8 elements. */
MOK_API mok_status mok_tma_descriptor_2d_typed(void *descriptor, void *data,
                                 mok_dtype dtype, int64_t rows, int64_t cols,
                                 int64_t row_stride, uint32_t box_rows,
                                 uint32_t box_cols);

/*---------------------------------------------------------------------------
 * Compiled layers: what the compiler emits for one layer (PTX + metadata,
 * docs/Runtime.md). Create from the metadata (no driver needed: the checks
 * work anywhere), load on a device, then run forwards on any stream.
 *-------------------------------------------------------------------------*/

typedef struct mok_layer_s *mok_layer;

typedef struct mok_named_tensor {
  const char *name; /* the layer operand: "x", "top_experts", ..., or an
                       extra output */
  mok_tensor tensor;
} mok_named_tensor;

/* Parses and checks the metadata (versions 1 to 5, docs/Runtime.md). */
MOK_API mok_status mok_layer_create(const char *metadata_json, mok_layer *out);
/* Frees the layer: its workspace, its module, its bound views' copies. The
 * caller first synchronizes the streams of its forwards in flight. NULL is a
 * no-op; both clear mok_last_error(). A destroyed (or unknown) handle is
 * refused: nothing is freed, and mok_last_error() names it. */
MOK_API void mok_layer_destroy(mok_layer layer);
/* The layer's inputs in order (NULL past the last). A bad handle (0 or
 * NULL) or index (NULL) is named in mok_last_error(). */
MOK_API int mok_layer_input_count(mok_layer layer);
MOK_API const char *mok_layer_input_name(mok_layer layer, int index);
/* The layer's outputs in order (params of role "output"; at least one; NULL
 * past the last). Index 0 is the output, `out` of mok_layer_check and
 * mok_layer_forward; the others are extra outputs (a backward's weight
 * gradients, a training forward's saved context), passed among the named
 * tensors by name. Dtypes and shapes are the metadata's. */
MOK_API int mok_layer_output_count(mok_layer layer);
MOK_API const char *mok_layer_output_name(mok_layer layer, int index);
/* Checks the named tensors — every input and every extra output, in any
 * order, each exactly once — and `out` (the first output, never among the
 * named tensors) against the metadata: dtype, shape, dense row-major layout,
 * 16-byte alignment. An output whose bytes overlap another output's or a
 * dense input's is refused, naming both (inputs bound to weight views are
 * not checked); inputs may overlap each other. */
MOK_API mok_status mok_layer_check(mok_layer layer,
                                   const mok_named_tensor *inputs,
                                   size_t count, const mok_tensor *out);
/* Loads the PTX on `device` (mok_module_load_image without a cubin) and
 * allocates the workspace, zeroing what the metadata says must start at
 * zero. A failed load frees what it allocated and unloads the module: the
 * layer stays not loaded, and may be loaded again. */
MOK_API mok_status mok_layer_load(mok_layer layer, int device, const char *ptx);
/* mok_layer_load from a cubin and/or PTX, as mok_module_load_image takes
 * them (a shipped cubin for the device's chip skips the JIT; PTX is the
 * fallback). */
MOK_API mok_status mok_layer_load_image(mok_layer layer, int device,
                                        const char *ptx, const void *cubin,
                                        size_t cubin_size);
/* How the layer's module was loaded (mok_module_load_source); MOK_LOAD_NONE
 * and "" for a layer not loaded. `detail` may be NULL. */
MOK_API mok_status mok_layer_load_source(mok_layer layer,
                                         mok_load_source *source,
                                         const char **detail);
/* Binds a weight view to a routed weight operand ("gate_weights",
 * "up_weights" or "down_weights") of a layer whose kernel reads that operand
 * only through tensor maps (metadata param "access": "tensor_maps"); a kernel
 * that reads it by pointer (the scalar GEMM path) refuses views by name. The
 * view must be bf16 [E, rows, cols] with the operand's sizes, a row stride
 * that is a multiple of 8 elements and 16-byte aligned expert bases. While
 * bound, mok_layer_check/mok_layer_forward take the operand from the view and
 * refuse it among the named inputs (it stays listed by mok_layer_input_name);
 * view = NULL unbinds (a no-op for an input that is not bound). The view is
 * copied, with the pointer table of a MOK_WEIGHTS_PER_EXPERT view, so neither
 * need outlive the call; the device memory stays the caller's and must
 * stay valid until the last forward that reads it has finished on the GPU,
 * not just while bound: unbinding or rebinding does not wait for forwards
 * in flight. The TMA descriptors are rebuilt by the next forward
 * (so bind before capturing a CUDA graph, not during). No driver needed:
 * works before or after mok_layer_load. A refused view leaves the previous
 * binding in place. */
MOK_API mok_status mok_layer_bind_weights(mok_layer layer, const char *name,
                                          const mok_expert_weights *view);
/* Checks the arguments, rebuilds the TMA descriptors when a buffer's address
 * changed since the last call (never during CUDA-graph replay, where the
 * buffers stay put), and launches on `stream` (a CUstream, NULL = legacy
 * default). Asynchronous; no host synchronization, except that a forward
 * that rebuilds the descriptors uploads them with cuMemcpyHtoDAsync on
 * `stream` from pageable host memory, which the driver may do by first
 * waiting for `stream`'s earlier work. The upload is ordered on `stream`:
 * forwards of one layer must be ordered among themselves (one stream, or
 * streams the caller orders), since they share the descriptors. */
MOK_API mok_status mok_layer_forward(mok_layer layer,
                                     const mok_named_tensor *inputs,
                                     size_t count, const mok_tensor *out,
                                     void *stream);
/* The expert-parallel group the layer reports: the bound communicator's
 * {size, rank, ncclComm_t (NULL for a local group)} while one is bound
 * (mok_layer_bind_comm), else the group set here, by default {1, 0,
 * NULL}; group = NULL sets that default. This call sets size 1 only: the
 * group is checked as mok_ep_group_check does (0 <= rank < size; a
 * communicator for size > 1: MOK_ERROR_INVALID_ARGUMENT), then size > 1 is
 * refused naming mok_layer_bind_comm (MOK_ERROR_INVALID_ARGUMENT), then a
 * size other than the layer's compiled one (mok_layer_ep_size) naming both,
 * and any group while a communicator is bound. The group is copied; the
 * communicator stays the caller's. A refused group leaves the previous one.
 * No driver needed: before or after mok_layer_load. */
MOK_API mok_status mok_layer_set_ep_group(mok_layer layer,
                                          const mok_ep_group *group);
/* The layer's current group (see mok_layer_set_ep_group). */
MOK_API mok_status mok_layer_ep_group(mok_layer layer, mok_ep_group *group);
/* The expert-parallel size the layer was compiled for: the metadata's "ep",
 * 1 when the metadata has none. */
MOK_API mok_status mok_layer_ep_size(mok_layer layer, int32_t *size);
/* The bytes of the symmetric exchange buffer each rank needs (the
 * metadata's "symmetric_bytes"; 0 for ep = 1). No driver needed. */
MOK_API mok_status mok_layer_symmetric_bytes(mok_layer layer, size_t *bytes);
/* Binds the layer to communicator `comm`, whose size must be the layer's
 * compiled ep (named otherwise), on the device the layer is loaded on (if
 * it is). A layer compiled for ep = N > 1 needs one before mok_layer_load
 * and every forward; its forwards then pass the kernel its parameters of
 * roles "peers" (the exchange buffer's peer table), "rank" and "epoch".
 * The exchange buffer is `buffer`, a symmetric buffer of `comm` of at least
 * the layer's symmetric_bytes (named otherwise) that no other layer uses,
 * zeroed here (with NCCL, the ranks then meet in an allgather that also
 * checks they bind the same size: every rank binds, none has kernels of
 * the buffer in flight); or, with `buffer` NULL, one of symmetric_bytes the
 * layer allocates (mok_comm_alloc_symmetric: collective) and frees when it
 * is unbound or destroyed. Either way binding is collective for an NCCL
 * communicator: every rank binds its layers in the same order. `comm` may be
 * NULL beside a `buffer` (its communicator). Binding the communicator and
 * buffer already bound changes nothing; a new binding starts the epoch
 * again (the next forward passes 1). comm = buffer = NULL unbinds. A layer
 * compiled for ep = 1 takes a communicator of one rank and no buffer, and
 * runs as without one. A refused binding leaves the previous one. Unbinding
 * does not wait for forwards in flight. */
MOK_API mok_status mok_layer_bind_comm(mok_layer layer, mok_comm comm,
                                       mok_symmetric buffer);
/* The bound communicator and exchange buffer (NULL, NULL when none); either
 * pointer may be NULL. */
MOK_API mok_status mok_layer_comm(mok_layer layer, mok_comm *comm,
                                  mok_symmetric *buffer);
/* The epoch the layer's last forward passed its kernel (0: none since the
 * communicator was bound). Each forward of a layer bound to a communicator
 * passes the next one, 1, 2, ...: the value its kernel writes into its
 * signal flags, so the flags never need resetting between launches. */
MOK_API mok_status mok_layer_epoch(mok_layer layer, uint64_t *epoch);
/* The size in bytes of the workspace buffer `name` (a param of role
 * "workspace"): its elements times its dtype's size. No driver needed. */
MOK_API mok_status mok_layer_workspace_size(mok_layer layer, const char *name,
                                            size_t *bytes);
/* Copies the whole workspace buffer `name` (a param of role "workspace",
 * e.g. the "phase_clock" timestamps of a profiling kernel) of a loaded layer
 * to `host`, synchronously (cuMemcpyDtoH); `bytes` must be the buffer's size
 * (mok_layer_workspace_size). The copy is ordered only against the legacy
 * default stream: the caller must first synchronize the stream the layer ran
 * on. The arguments are checked in this order: layer, name and host not
 * NULL, `name` against the metadata, `bytes`, then that the layer is
 * loaded — so a wrong name or size is reported without a driver. */
MOK_API mok_status mok_layer_read_workspace(mok_layer layer, const char *name,
                                            void *host, size_t bytes);

/* What a layer's kernels reported (mok_layer_take_report). */
typedef struct mok_kernel_report {
  /* Routes whose expert id was neither -1 nor in [0, E): the kernels
   * dropped them (no row, no output, a zero router-weight gradient), and
   * report one of them: its id (low 32 bits) and its route (token * top_k +
   * slot). */
  int32_t bad_routes;
  int32_t bad_expert_id;
  int64_t bad_route;
  /* A grid barrier whose bounded wait (compiled with barrier-timeout-ms)
   * timed out: its index among the kernel's barriers (in schedule order),
   * the CTAs that had arrived, the grid's CTAs and the CTA that gave up. The
   * kernel's results are not defined. */
  int32_t barrier_timed_out;
  int32_t barrier_index, barrier_arrived, barrier_grid, barrier_cta;
  /* Expert parallelism: the routes sent to some rank's experts exceeded the
   * receive capacity (the metadata's recv_capacity). Every rank of the
   * group saw it and exchanged no row: the call's output is not defined.
   * The first such rank and its routes (saturated to 2^31 - 1). */
  int32_t capacity_exceeded;
  int32_t capacity_rank, capacity_routes;
  /* With barrier_timed_out: the bounded wait was an expert-parallel
   * exchange's wait for the other ranks' flags (its index counts the
   * kernel's bounded waits and barriers together), not a grid barrier: the
   * rank whose flag did not come and the exchange's step (0 counts, 1 rows,
   * 2 results); barrier_cta is the CTA that gave up. */
  int32_t exchange_wait;
  int32_t wait_rank, wait_step;
} mok_kernel_report;

/* Takes what the layer's kernels reported since the last take: with `wait`,
 * after synchronizing `stream` (the stream of the layer's last forward, a
 * CUstream, NULL = legacy default; a stream being captured into a CUDA
 * graph is not waited for); without, whatever launches that have finished
 * wrote (never blocking). MOK_OK with *report zeroed when nothing
 * was reported; else MOK_ERROR_BAD_ROUTING or MOK_ERROR_TIMEOUT (a timeout
 * first) with *report filled, the message naming the route or the barrier,
 * and the report cleared. After a timeout the grid barrier's state is
 * reset, so the layer may run again. A kernel without a report (compiled
 * before it existed) reports nothing. `report` may be NULL. */
MOK_API mok_status mok_layer_take_report(mok_layer layer, void *stream,
                                         int wait, mok_kernel_report *report);

/* The grid of the layer's forwards, in CTAs: 0 (the default) for one CTA a
 * multiprocessor (as many whole clusters as fit, with clusters), or a
 * smaller grid, for a layer that shares the GPU with kernels it must run
 * beside (a multiple of the kernel's cluster size). Every CTA must be
 * resident at once: mok_layer_load refuses a grid larger than the
 * kernel's occupancy allows, and so does this call on a loaded layer
 * (MOK_ERROR_INVALID_ARGUMENT, naming both sizes). The launch is
 * cooperative, so the driver refuses a grid that cannot be resident at
 * once (another context holding multiprocessors, MPS limits) rather than
 * letting it hang. */
MOK_API mok_status mok_layer_set_grid(mok_layer layer, uint32_t ctas);
/* The grid the next forward launches (*ctas) and, on a loaded layer, the
 * most CTAs the kernel's occupancy lets be resident at once (*max_ctas; 0
 * before mok_layer_load). Either pointer may be NULL. */
MOK_API mok_status mok_layer_grid(mok_layer layer, uint32_t *ctas,
                                  uint32_t *max_ctas);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOK_RUNTIME_H */
