// Can cuDNN fold resnet18's batch norms into its convolutions on this GPU, and at what cost?
//
// Issue 16's resnet18 target (0.75x torch.compile's step) is below what the convolutions
// plus batch norm's passes at memory bandwidth take (bench/results-h200-2026-12-05.txt): only
// batch norm folded into the convolutions could reach it. cuDNN's graph API has the patterns
// for that on Ampere and Hopper (runtime fusion engines): the previous batch norm's
// scale-bias-ReLU as the convolution's prologue and the output's per-channel sums as its
// epilogue in the forward; dgrad with the ReLU's and batch norm's backward, and wgrad with the
// prologue recomputed, in the backward. This probe builds each pattern for every convolution
// shape of resnet18 (CIFAR stem, batch 256, bf16 channels-last, fp32 accumulation) through
// cuDNN's backend API, runs the heuristics' first engine configurations that build, and prints
// the fastest of each against the plain convolution: whether the engines exist here, and what
// folding would cost or save. It times kernels only (CUDA events over repeated runs); the
// numbers it does not give (the batch-norm passes that folding removes) are in the profile.
//
// Build and run (bench/gpu_bench.sh's machine; any cuDNN 9 with its headers):
// A GPU build makes it where cuDNN 9's headers are found (CUDNN_ROOT may point at cuDNN's
// include/ and lib/); not installed.
//   build/cudnn_fusion_probe [batch [bf16|fp16]]   (default 256 bf16)
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

// CUDNN_ATTR_OPERATIONGRAPH_HANDLE and CUDNN_ATTR_EXECUTION_PLAN_HANDLE are deprecated in
// cuDNN 9 but still taken, and needed before 9.x's device-property descriptors.
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error(what); }

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string(what) + ": " + cudaGetErrorString(status));
}

std::string cudnn_message(cudnnStatus_t status) {
  char last[1024] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  return std::string(cudnnGetErrorString(status)) + (last[0] ? std::string(" (") + last + ")" : "");
}

void check_cudnn(cudnnStatus_t status, const char* what) {
  if (status != CUDNN_STATUS_SUCCESS) fail(std::string(what) + ": " + cudnn_message(status));
}

// One backend descriptor, destroyed with its owner.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    check_cudnn(cudnnBackendCreateDescriptor(type, &desc_), "cudnnBackendCreateDescriptor");
  }
  ~Desc() { cudnnBackendDestroyDescriptor(desc_); }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;

  Desc& set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
            const void* values) {
    check_cudnn(cudnnBackendSetAttribute(desc_, name, type, count, values),
                ("cudnnBackendSetAttribute " + std::to_string(name)).c_str());
    return *this;
  }
  Desc& set_desc(cudnnBackendAttributeName_t name, const Desc& other) {
    return set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &other.desc_);
  }
  Desc& set_int64(cudnnBackendAttributeName_t name, std::vector<int64_t> values) {
    return set(name, CUDNN_TYPE_INT64, static_cast<int64_t>(values.size()), values.data());
  }
  Desc& set_dtype(cudnnBackendAttributeName_t name, cudnnDataType_t type) {
    return set(name, CUDNN_TYPE_DATA_TYPE, 1, &type);
  }
  // Throws with cuDNN's message: a pattern or an engine configuration that does not build.
  void finalize(const char* what) { check_cudnn(cudnnBackendFinalize(desc_), what); }
  cudnnBackendDescriptor_t get() const { return desc_; }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

using DescPtr = std::shared_ptr<Desc>;

// Every descriptor of the pattern being built, kept until it has been timed: cuDNN's finalized
// descriptors may refer to the ones set into them.
std::vector<DescPtr> alive;

DescPtr make_desc(cudnnBackendDescriptorType_t type) {
  alive.push_back(std::make_shared<Desc>(type));
  return alive.back();
}

// --- Tensors: NHWC (channels-last) data, KRSC filters, [1, C, 1, 1] per-channel arrays.

struct Tensor {
  DescPtr desc;
  int64_t uid;
};

int64_t next_uid = 1;

// The activations' and filters' type: bf16, or fp16 (`cudnn_fusion_probe BATCH fp16`: cuDNN's own
// samples of these patterns are fp16).
cudnnDataType_t io_type = CUDNN_DATA_BFLOAT16;

Tensor make_tensor(std::vector<int64_t> dims, std::vector<int64_t> strides, cudnnDataType_t type,
                   bool is_virtual) {
  Tensor t{make_desc(CUDNN_BACKEND_TENSOR_DESCRIPTOR), next_uid++};
  const int64_t alignment = 16;
  t.desc->set_dtype(CUDNN_ATTR_TENSOR_DATA_TYPE, type)
      .set_int64(CUDNN_ATTR_TENSOR_DIMENSIONS, dims)
      .set_int64(CUDNN_ATTR_TENSOR_STRIDES, strides)
      .set_int64(CUDNN_ATTR_TENSOR_UNIQUE_ID, {t.uid})
      .set_int64(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, {alignment});
  if (is_virtual) {
    const bool yes = true;
    t.desc->set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
  }
  t.desc->finalize("tensor");
  return t;
}

// [n, c, h, w] stored as NHWC.
Tensor activation(int64_t n, int64_t c, int64_t h, int64_t w, cudnnDataType_t type,
                  bool is_virtual = false) {
  return make_tensor({n, c, h, w}, {c * h * w, 1, w * c, c}, type, is_virtual);
}

// [k, c, r, s] stored as KRSC.
Tensor filter(int64_t k, int64_t c, int64_t r, int64_t s) {
  return make_tensor({k, c, r, s}, {c * r * s, 1, s * c, c}, io_type, false);
}

Tensor per_channel(int64_t c, cudnnDataType_t type) {
  return make_tensor({1, c, 1, 1}, {c, 1, c, c}, type, false);
}

// --- Operations.

struct Conv {
  int64_t n, c, h, w, k, r, stride, pad;
  int count;  // how many of resnet18's 20 convolutions have this shape
  const char* name;
  int64_t p() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t q() const { return (w + 2 * pad - r) / stride + 1; }
};

DescPtr conv_descriptor(const Conv& conv) {
  DescPtr d = make_desc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  d->set_dtype(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_DATA_FLOAT)
      .set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode)
      .set_int64(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, {2})
      .set_int64(CUDNN_ATTR_CONVOLUTION_DILATIONS, {1, 1})
      .set_int64(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, {conv.stride, conv.stride})
      .set_int64(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, {conv.pad, conv.pad})
      .set_int64(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, {conv.pad, conv.pad});
  d->finalize("convolution descriptor");
  return d;
}

// The convolution operations take alpha = 1, beta = 0 (float: fp32 compute).
DescPtr conv_op(cudnnBackendDescriptorType_t type, const Conv& conv, const Tensor& a,
                const Tensor& b, const Tensor& out) {
  const DescPtr cd = conv_descriptor(conv);
  // Each direction's attribute names for (a, b, out, descriptor, alpha, beta).
  struct Names {
    cudnnBackendAttributeName_t a, b, out, conv, alpha, beta;
  };
  const Names names =
      type == CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR  // a = x, b = w
          ? Names{CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA}
      : type == CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR  // a = dy, b = w
          ? Names{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA}
          : Names{CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,  // a = x, b = dy
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
                  CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  DescPtr op = make_desc(type);
  const float alpha = 1.f, beta = 0.f;
  op->set_desc(names.a, *a.desc)
      .set_desc(names.b, *b.desc)
      .set_desc(names.out, *out.desc)
      .set_desc(names.conv, *cd)
      .set(names.alpha, CUDNN_TYPE_FLOAT, 1, &alpha)
      .set(names.beta, CUDNN_TYPE_FLOAT, 1, &beta);
  op->finalize("convolution operation");
  return op;
}

// out = mode(x, b) (b unused by unary modes); for RELU_BWD, x is dy and b is the forward input.
DescPtr pointwise_op(cudnnPointwiseMode_t mode, const Tensor& x, const Tensor* b,
                     const Tensor& out) {
  DescPtr pw = make_desc(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw->set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_DATA_FLOAT);
  pw->finalize("pointwise descriptor");
  DescPtr op = make_desc(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, *pw);
  if (mode == CUDNN_POINTWISE_RELU_BWD) {
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, *x.desc)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *b->desc)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, *out.desc);
  } else {
    op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, *x.desc)
        .set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, *out.desc);
    if (b) op->set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b->desc);
  }
  op->finalize("pointwise operation");
  return op;
}

DescPtr genstats_op(const Tensor& x, const Tensor& sum, const Tensor& sq_sum) {
  DescPtr op = make_desc(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR);
  const cudnnGenStatsMode_t mode = CUDNN_GENSTATS_SUM_SQSUM;
  op->set(CUDNN_ATTR_OPERATION_GENSTATS_MODE, CUDNN_TYPE_GENSTATS_MODE, 1, &mode)
      .set_dtype(CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC, CUDNN_DATA_FLOAT)
      .set_desc(CUDNN_ATTR_OPERATION_GENSTATS_XDESC, *x.desc)
      .set_desc(CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, *sum.desc)
      .set_desc(CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, *sq_sum.desc);
  op->finalize("genstats operation");
  return op;
}

struct BnBackwardWeights {
  Tensor dscale, dbias, eq_scale_dy, eq_scale_x, eq_bias;
};

DescPtr bn_backward_weights_op(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& invstd, const Tensor& scale,
                               const BnBackwardWeights& out) {
  DescPtr op = make_desc(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR);
  op->set_dtype(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC, CUDNN_DATA_FLOAT)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, *mean.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, *invstd.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, *scale.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, *x.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, *dy.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, *out.dscale.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, *out.dbias.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, *out.eq_scale_dy.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, *out.eq_scale_x.desc)
      .set_desc(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, *out.eq_bias.desc);
  op->finalize("batch norm backward weights operation");
  return op;
}

// --- Device buffers: one random pool per dtype, each tensor at its own offset.

struct Pool {
  void* base = nullptr;
  size_t bytes = 0, used = 0;
  void* take(size_t n) {
    n = (n + 255) / 256 * 256;
    if (used + n > bytes) fail("buffer pool exhausted");
    void* p = static_cast<char*>(base) + used;
    used += n;
    return p;
  }
};

// --- A pattern: its operations, the tensors it reads and writes, and the plans that build.

struct Pattern {
  std::vector<DescPtr> ops;
  std::vector<std::pair<int64_t, void*>> data;  // uid -> device pointer
};

struct Timing {
  double best_us = -1;  // < 0: no engine configuration built
  int64_t engine = -1;
  int candidates = 0, built = 0;
  std::string why;  // the first failure, when none built
};

int64_t engine_index(cudnnBackendDescriptor_t config) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t engine_desc = engine.get();
  int64_t count = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &count, &engine_desc) != CUDNN_STATUS_SUCCESS)
    return -1;
  int64_t index = -1;
  cudnnBackendGetAttribute(engine_desc, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1,
                           &count, &index);
  return index;
}

// Per pattern: the first configurations of each heuristics mode (A, then the fallback list),
// tried until kMaxBuilt of them build (runtime-compiled engines take a while each).
constexpr int kMaxConfigs = 6;
constexpr int kMaxBuilt = 3;
constexpr int kWarmupRuns = 2;
constexpr int kTimedRuns = 10;

Timing time_pattern(cudnnHandle_t handle, const Pattern& pattern, Pool& workspace_pool) {
  Timing timing;
  try {
    Desc graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    std::vector<cudnnBackendDescriptor_t> ops;
    for (const DescPtr& op : pattern.ops) ops.push_back(op->get());
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
              static_cast<int64_t>(ops.size()), ops.data())
        .set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    graph.finalize("operation graph");

    std::vector<std::unique_ptr<Desc>> configs;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) try {
      Desc heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
      heuristics.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph)
          .set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
      heuristics.finalize("heuristics");
      int64_t available = 0;
      check_cudnn(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr),
                  "heuristics' result count");
      const int64_t wanted = std::min<int64_t>(available, kMaxConfigs);
      if (wanted == 0) continue;
      std::vector<cudnnBackendDescriptor_t> raw;
      for (int64_t i = 0; i < wanted; ++i) {
        configs.push_back(std::make_unique<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        raw.push_back(configs.back()->get());
      }
      int64_t returned = 0;
      check_cudnn(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, wanted, &returned,
                                           raw.data()),
                  "heuristics' results");
      configs.resize(configs.size() - static_cast<size_t>(wanted - returned));
    } catch (const std::exception& e) {  // this mode has nothing; the other may
      if (timing.why.empty()) timing.why = e.what();
    }
    timing.candidates = static_cast<int>(configs.size());
    if (configs.empty() && timing.why.empty())
      timing.why = "the heuristics offer no engine configuration";

    cudaEvent_t start, stop;
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    for (const auto& config : configs) {
      if (timing.built >= kMaxBuilt) break;
      try {
        Desc plan(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        cudnnBackendDescriptor_t raw_config = config->get();
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle)
            .set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                 &raw_config);
        plan.finalize("execution plan");
        int64_t workspace_bytes = 0, count = 0;
        check_cudnn(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                             CUDNN_TYPE_INT64, 1, &count, &workspace_bytes),
                    "workspace size");
        if (static_cast<size_t>(workspace_bytes) > workspace_pool.bytes)
          fail("needs " + std::to_string(workspace_bytes) + " bytes of workspace");
        std::vector<int64_t> uids;
        std::vector<void*> pointers;
        for (const auto& [uid, pointer] : pattern.data) {
          uids.push_back(uid);
          pointers.push_back(pointer);
        }
        Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
        pack.set_int64(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
            .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                 static_cast<int64_t>(pointers.size()), pointers.data())
            .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace_pool.base);
        pack.finalize("variant pack");
        for (int i = 0; i < kWarmupRuns; ++i)
          check_cudnn(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
        check_cuda(cudaEventRecord(start), "cudaEventRecord");
        for (int i = 0; i < kTimedRuns; ++i)
          check_cudnn(cudnnBackendExecute(handle, plan.get(), pack.get()), "execute");
        check_cuda(cudaEventRecord(stop), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float ms = 0.f;
        check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
        const double us = 1e3 * ms / kTimedRuns;
        ++timing.built;
        if (timing.best_us < 0 || us < timing.best_us) {
          timing.best_us = us;
          timing.engine = engine_index(config->get());
        }
      } catch (const std::exception& e) {
        if (timing.why.empty()) timing.why = e.what();
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    check_cuda(cudaGetLastError(), "after the runs");
  } catch (const std::exception& e) {
    if (timing.why.empty()) timing.why = e.what();
  }
  return timing;
}

// --- The patterns, per convolution shape.

struct Buffers {
  Pool bf16, fp32, workspace;
};

// Per-channel float inputs (scale, bias, mean, invstd) and outputs.
Tensor channel_input(int64_t c, Buffers& buffers, Pattern& pattern,
                     cudnnDataType_t type = CUDNN_DATA_FLOAT) {
  Tensor t = per_channel(c, type);
  pattern.data.emplace_back(t.uid, type == CUDNN_DATA_FLOAT ? buffers.fp32.take(4 * c)
                                                             : buffers.bf16.take(2 * c));
  return t;
}

Tensor data_tensor(Tensor t, size_t elements, Buffers& buffers, Pattern& pattern) {
  pattern.data.emplace_back(t.uid, buffers.bf16.take(2 * elements));
  return t;
}

// relu(x * scale + bias) per channel of the convolution's input, as virtual fp32 tensors.
Tensor scale_bias_relu(const Conv& v, const Tensor& x, Buffers& b, Pattern& p,
                       cudnnDataType_t type) {
  Tensor scale = channel_input(v.c, b, p, type), bias = channel_input(v.c, b, p, type);
  Tensor scaled = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  Tensor shifted = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  Tensor relu = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_MUL, x, &scale, scaled));
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_ADD, scaled, &bias, shifted));
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_RELU_FWD, shifted, nullptr, relu));
  return relu;
}

// Each builder returns the pattern for `conv`; every pool is rewound by the caller.
Pattern fprop(const Conv& v, Buffers& b, bool prologue, bool statistics,
              cudnnDataType_t prologue_type) {
  Pattern p;
  const size_t in = v.n * v.c * v.h * v.w, out = v.n * v.k * v.p() * v.q();
  Tensor x = data_tensor(activation(v.n, v.c, v.h, v.w, io_type), in, b, p);
  Tensor w = data_tensor(filter(v.k, v.c, v.r, v.r), v.k * v.c * v.r * v.r, b, p);
  Tensor y = data_tensor(activation(v.n, v.k, v.p(), v.q(), io_type), out, b, p);
  // relu(x * scale + bias): the previous batch norm, applied on the way in.
  const Tensor conv_in = prologue ? scale_bias_relu(v, x, b, p, prologue_type) : x;
  p.ops.push_back(
      conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, v, conv_in, w, y));
  if (statistics) {  // this batch norm's per-channel sums, on the way out
    Tensor sum = channel_input(v.k, b, p), sq_sum = channel_input(v.k, b, p);
    p.ops.push_back(genstats_op(y, sum, sq_sum));
  }
  return p;
}

// dgrad alone, or with the ReLU's backward against relu(bn(x)) recomputed from the previous
// convolution's output x and batch norm's backward weights (dscale, dbias and the equivalent
// coefficients of dx).
Pattern dgrad(const Conv& v, Buffers& b, bool fused) {
  Pattern p;
  const size_t in = v.n * v.c * v.h * v.w, out = v.n * v.k * v.p() * v.q();
  Tensor dy = data_tensor(activation(v.n, v.k, v.p(), v.q(), io_type), out, b, p);
  Tensor w = data_tensor(filter(v.k, v.c, v.r, v.r), v.k * v.c * v.r * v.r, b, p);
  if (!fused) {
    Tensor dx = data_tensor(activation(v.n, v.c, v.h, v.w, io_type), in, b, p);
    p.ops.push_back(
        conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, v, dy, w, dx));
    return p;
  }
  Tensor dgrad_out = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  p.ops.push_back(
      conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, v, dy, w, dgrad_out));
  Tensor x = data_tensor(activation(v.n, v.c, v.h, v.w, io_type), in, b, p);
  Tensor mean = channel_input(v.c, b, p), invstd = channel_input(v.c, b, p);
  Tensor scale = channel_input(v.c, b, p), bias = channel_input(v.c, b, p);
  Tensor centred = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  Tensor normalised = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  Tensor scaled = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  Tensor bn_out = activation(v.n, v.c, v.h, v.w, CUDNN_DATA_FLOAT, true);
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_SUB, x, &mean, centred));
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_MUL, centred, &invstd, normalised));
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_MUL, normalised, &scale, scaled));
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_ADD, scaled, &bias, bn_out));
  Tensor drelu = data_tensor(activation(v.n, v.c, v.h, v.w, io_type), in, b, p);
  p.ops.push_back(pointwise_op(CUDNN_POINTWISE_RELU_BWD, dgrad_out, &bn_out, drelu));
  BnBackwardWeights weights{channel_input(v.c, b, p), channel_input(v.c, b, p),
                            channel_input(v.c, b, p), channel_input(v.c, b, p),
                            channel_input(v.c, b, p)};
  p.ops.push_back(bn_backward_weights_op(drelu, x, mean, invstd, scale, weights));
  return p;
}

// wgrad alone, or with relu(x * scale + bias) recomputed on the way in.
Pattern wgrad(const Conv& v, Buffers& b, bool prologue, cudnnDataType_t prologue_type) {
  Pattern p;
  const size_t in = v.n * v.c * v.h * v.w, out = v.n * v.k * v.p() * v.q();
  Tensor x = data_tensor(activation(v.n, v.c, v.h, v.w, io_type), in, b, p);
  Tensor dy = data_tensor(activation(v.n, v.k, v.p(), v.q(), io_type), out, b, p);
  Tensor dw = data_tensor(filter(v.k, v.c, v.r, v.r), v.k * v.c * v.r * v.r, b, p);
  const Tensor conv_in = prologue ? scale_bias_relu(v, x, b, p, prologue_type) : x;
  p.ops.push_back(
      conv_op(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, v, conv_in, dy, dw));
  return p;
}

std::string cell(const Timing& t) {
  char text[64];
  if (t.best_us < 0) return "      -";
  std::snprintf(text, sizeof(text), "%7.1f", t.best_us);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int64_t n = argc > 1 ? std::stoll(argv[1]) : 256;
    const std::string io_name = argc > 2 ? argv[2] : "bf16";
    if (io_name != "bf16" && io_name != "fp16")
      fail("the I/O type is bf16 or fp16, not " + io_name);
    if (io_name == "fp16") io_type = CUDNN_DATA_HALF;
    // resnet18 with the CIFAR stem at 32x32: every convolution, by shape (the stem's input
    // has 3 channels; the 1x1 strided convolutions are the shortcuts' downsampling).
    const std::vector<Conv> convs = {
        {n, 3, 32, 32, 64, 3, 1, 1, 1, "stem 3->64 32x32"},
        {n, 64, 32, 32, 64, 3, 1, 1, 4, "layer1 64->64 32x32"},
        {n, 64, 32, 32, 128, 3, 2, 1, 1, "layer2 64->128 /2"},
        {n, 128, 16, 16, 128, 3, 1, 1, 3, "layer2 128->128 16x16"},
        {n, 64, 32, 32, 128, 1, 2, 0, 1, "layer2 shortcut 1x1 /2"},
        {n, 128, 16, 16, 256, 3, 2, 1, 1, "layer3 128->256 /2"},
        {n, 256, 8, 8, 256, 3, 1, 1, 3, "layer3 256->256 8x8"},
        {n, 128, 16, 16, 256, 1, 2, 0, 1, "layer3 shortcut 1x1 /2"},
        {n, 256, 8, 8, 512, 3, 2, 1, 1, "layer4 256->512 /2"},
        {n, 512, 4, 4, 512, 3, 1, 1, 3, "layer4 512->512 4x4"},
        {n, 256, 8, 8, 512, 1, 2, 0, 1, "layer4 shortcut 1x1 /2"},
    };
    int device = 0;
    cudaDeviceProp prop{};
    check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::printf("# %s (sm_%d%d), cuDNN %zu, batch %lld, %s NHWC, fp32 accumulation\n", prop.name,
                prop.major, prop.minor, cudnnGetVersion(), static_cast<long long>(n),
                io_name.c_str());
    cudnnHandle_t handle;
    check_cudnn(cudnnCreate(&handle), "cudnnCreate");

    Buffers buffers;
    buffers.bf16.bytes = size_t{6} * 2 * n * 64 * 32 * 32 + (size_t{64} << 20);
    buffers.fp32.bytes = size_t{1} << 20;
    buffers.workspace.bytes = size_t{512} << 20;
    for (Pool* pool : {&buffers.bf16, &buffers.fp32, &buffers.workspace})
      check_cuda(cudaMalloc(&pool->base, pool->bytes), "cudaMalloc");
    {  // random values: bf16 in [-1, 1) and positive per-channel floats
      std::mt19937 random(42);
      std::uniform_real_distribution<float> uniform(-1.f, 1.f);
      std::vector<uint16_t> host_bf16(size_t{1} << 20);  // 2 MiB, repeated over the pool
      for (uint16_t& v : host_bf16) {
        const float f = uniform(random);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        v = static_cast<uint16_t>(bits >> 16);
      }
      const size_t block_bytes = host_bf16.size() * 2;
      for (size_t at = 0; at < buffers.bf16.bytes; at += block_bytes)
        check_cuda(cudaMemcpy(static_cast<char*>(buffers.bf16.base) + at, host_bf16.data(),
                              std::min(block_bytes, buffers.bf16.bytes - at),
                              cudaMemcpyHostToDevice), "cudaMemcpy");
      std::vector<float> host_fp32(buffers.fp32.bytes / 4);
      for (float& v : host_fp32) v = 0.5f + 0.5f * (uniform(random) + 1.f);
      check_cuda(cudaMemcpy(buffers.fp32.base, host_fp32.data(), buffers.fp32.bytes,
                            cudaMemcpyHostToDevice), "cudaMemcpy");
    }

    // Columns, us per call (the fastest engine configuration built):
    //   fprop          the convolution alone
    //   fprop+stats    with the batch norm's per-channel sum and sum of squares (genstats)
    //   sbr+fprop+st   also relu(x * scale + bias) of the previous batch norm as the prologue
    //   dgrad          the data gradient alone
    //   dgrad+drelu+bn with the ReLU's backward and batch norm's backward weights
    //   wgrad          the filter gradient alone
    //   sbr+wgrad      with relu(x * scale + bias) recomputed as the prologue
    const char* columns[] = {"fprop", "fprop+stats", "sbr+fprop+st", "dgrad", "dgrad+drelu+bn",
                             "wgrad", "sbr+wgrad"};
    constexpr int kColumns = 7;
    std::printf("%-26s %3s", "convolution", "x");
    for (const char* c : columns) std::printf(" %14s", c);
    std::printf("\n");
    double totals[kColumns] = {0};
    bool complete[kColumns];
    std::fill(complete, complete + kColumns, true);
    std::vector<std::string> details;  // per cell: the engine, or why none
    for (const Conv& conv : convs) {
      // The stem's input is the image: no batch norm before it and no gradient for it.
      const bool stem = conv.c == 3;
      Timing row[kColumns];
      const auto measure = [&](int column, auto build) {
        buffers.bf16.used = buffers.fp32.used = 0;
        try {
          row[column] = time_pattern(handle, build(), buffers.workspace);
        } catch (const std::exception& e) {  // the pattern itself did not build
          row[column].why = e.what();
        }
        alive.clear();
      };
      // The prologue's scale and bias: fp32 first (our batch norm's), the I/O type where fp32
      // builds no engine (cuDNN's own samples give them the I/O type).
      const auto with_prologue_types = [&](int column, auto build) {
        measure(column, [&] { return build(CUDNN_DATA_FLOAT); });
        if (row[column].best_us < 0) {
          const std::string fp32_why = row[column].why;
          measure(column, [&] { return build(io_type); });
          row[column].why = row[column].best_us < 0
                                ? "fp32: " + fp32_why + "; I/O type: " + row[column].why
                                : "scale and bias in the I/O type (fp32: " + fp32_why + ")";
        }
      };
      measure(0, [&] { return fprop(conv, buffers, false, false, CUDNN_DATA_FLOAT); });
      measure(1, [&] { return fprop(conv, buffers, false, true, CUDNN_DATA_FLOAT); });
      if (!stem)
        with_prologue_types(2, [&](cudnnDataType_t t) {
          return fprop(conv, buffers, true, true, t);
        });
      if (!stem) measure(3, [&] { return dgrad(conv, buffers, false); });
      if (!stem) measure(4, [&] { return dgrad(conv, buffers, true); });
      measure(5, [&] { return wgrad(conv, buffers, false, CUDNN_DATA_FLOAT); });
      if (!stem)
        with_prologue_types(6, [&](cudnnDataType_t t) { return wgrad(conv, buffers, true, t); });
      std::printf("%-26s %3d", conv.name, conv.count);
      for (int i = 0; i < kColumns; ++i) {
        std::printf(" %14s", cell(row[i]).c_str());
        if (stem && (i == 2 || i == 3 || i == 4 || i == 6)) continue;
        if (!stem && row[i].best_us < 0) complete[i] = false;
        if (!stem && row[i].best_us >= 0) totals[i] += conv.count * row[i].best_us;
        std::string detail = std::string(conv.name) + " / " + columns[i] + ": ";
        if (row[i].best_us >= 0)
          detail += "engine " + std::to_string(row[i].engine) + ", " +
                    std::to_string(row[i].built) + " built of " +
                    std::to_string(row[i].candidates) + " offered";
        if (!row[i].why.empty()) detail += (row[i].best_us >= 0 ? "; " : "") + row[i].why;
        details.push_back(detail);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    std::printf("%-26s %3d", "total without the stem", 19);
    for (int i = 0; i < kColumns; ++i)
      std::printf(" %13.1f%s", totals[i], complete[i] ? " " : "*");
    std::printf("\n# * some shapes built no engine for this pattern (not in the total)\n");
    std::printf("# Totals are count x us over the 19 convolutions after the stem, as if each\n"
                "# used the column's pattern; in the network the prologue patterns fit the\n"
                "# second convolution of each block (8), whose input is batch norm + ReLU of\n"
                "# the first.\n");
    for (const std::string& d : details) std::printf("# %s\n", d.c_str());
    cudnnDestroy(handle);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cudnn_fusion_probe: %s\n", e.what());
    return 1;
  }
}
