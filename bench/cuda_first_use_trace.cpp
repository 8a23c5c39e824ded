// A CUDA injection library (CUDA_INJECTION64_PATH=.../libcuda_first_use_trace.so) that prints,
// one line each, every CUDA driver and runtime call that takes at least CUDA_TRACE_MIN_US
// microseconds (500 by default), every module CUDA loads and the context's creation, with the
// wall-clock time the call began and the thread, to CUDA_TRACE_OUT (default: stderr). It
// showed where a GPU run's start-up and first step go (bench/README.md, "The first uses"):
// cuLibraryLoadData, CUDA loading a library's kernels at the first launch of one of them.
// Each line is written at once, since hpc_train ends with _Exit (Note [Quick exit]).
#include <cupti.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

namespace {

int out_fd = 2;
long long min_duration_ns = 500000;

long long wall_ns() {
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

void emit(const char* kind, const char* name, long long start_ns, long long duration_ns,
          long long bytes) {
  char line[512];
  const int n = std::snprintf(line, sizeof line, "TRACE %.6f tid=%ld %s %s ms=%.3f bytes=%lld\n",
                              start_ns * 1e-9, static_cast<long>(syscall(SYS_gettid)), kind,
                              name ? name : "?", duration_ns * 1e-6, bytes);
  if (n > 0 && n < static_cast<int>(sizeof line)) (void)!write(out_fd, line, n);
}

void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id,
                          const void* data) {
  if (domain == CUPTI_CB_DOMAIN_DRIVER_API || domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    const auto* call = static_cast<const CUpti_CallbackData*>(data);
    if (call->callbackSite == CUPTI_API_ENTER) {
      *call->correlationData = static_cast<uint64_t>(wall_ns());  // kept until the exit
      return;
    }
    const auto start = static_cast<long long>(*call->correlationData);
    const long long duration = wall_ns() - start;
    if (duration >= min_duration_ns)
      emit(domain == CUPTI_CB_DOMAIN_DRIVER_API ? "driver" : "runtime", call->functionName, start,
           duration, 0);
  } else if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    const auto* resource = static_cast<const CUpti_ResourceData*>(data);
    if (id == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
      const auto* module =
          static_cast<const CUpti_ModuleResourceData*>(resource->resourceDescriptor);
      emit("resource", "module_loaded", wall_ns(), 0, static_cast<long long>(module->cubinSize));
    } else if (id == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
      emit("resource", "context_created", wall_ns(), 0, 0);
    }
  }
}

}  // namespace

// Called by the CUDA driver when it initialises (cuInit) in a process that names this library.
extern "C" int InitializeInjection() {
  if (const char* path = std::getenv("CUDA_TRACE_OUT")) {
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) out_fd = fd;
  }
  if (const char* us = std::getenv("CUDA_TRACE_MIN_US")) min_duration_ns = std::atoll(us) * 1000;
  emit("init", "cuInit", wall_ns(), 0, 0);
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, on_callback, nullptr) != CUPTI_SUCCESS) {
    emit("init", "cuptiSubscribe_failed", wall_ns(), 0, 0);
    return 1;
  }
  cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
  cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE);
  return 1;
}
