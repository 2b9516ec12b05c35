// Binary cross-entropy on logits: the gradient (fp32, as the CPU's
// `bce_with_logits_grad`) and the summed loss (fp64, as `bce_with_logits_sum`).

__device__ __forceinline__ float stable_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    const float e = expf(x);
    return e / (1.0f + e);
}

// grad[i] = (sigmoid(logits[i]) - labels[i]) * scale.
extern "C" __global__ void bce_grad(const float* logits, const float* labels, unsigned long long n, float scale,
                                    float* grad) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        grad[i] = (stable_sigmoid(logits[i]) - labels[i]) * scale;
    }
}

// The summed loss in two deterministic passes, in fp64:
//   bce_sum: block k sums the terms max(x, 0) - x * y + ln(1 + e^-|x|) of
//     i in [k * BCE_CHUNK, (k + 1) * BCE_CHUNK): thread t takes i = t, t + 256, ...
//     in order, then the 256 partial sums are added pairwise in a fixed tree;
//     parts[k] = the block's sum. 256 threads per block.
//   sum_f64: out[0] = the parts added the same way (one block of 256 threads).
// Neither depends on the order blocks run in, so the result is the same on every run.
#define BCE_CHUNK 2048

__device__ __forceinline__ double block_sum_256(double acc, double* part) {
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    return part[0];
}

extern "C" __global__ void bce_sum(const float* logits, const float* labels, unsigned long long n, double* parts) {
    __shared__ double part[256];
    const unsigned long long lo = (unsigned long long)blockIdx.x * BCE_CHUNK;
    const unsigned long long hi = lo + BCE_CHUNK < n ? lo + BCE_CHUNK : n;
    double acc = 0.0;
    for (unsigned long long i = lo + threadIdx.x; i < hi; i += 256) {
        const double x = (double)logits[i];
        acc += fmax(x, 0.0) - x * (double)labels[i] + log1p(exp(-fabs(x)));
    }
    const double total = block_sum_256(acc, part);
    if (threadIdx.x == 0) parts[blockIdx.x] = total;
}

extern "C" __global__ void sum_f64(const double* parts, unsigned int m, double* out) {
    __shared__ double part[256];
    double acc = 0.0;
    for (unsigned int i = threadIdx.x; i < m; i += 256) acc += parts[i];
    const double total = block_sum_256(acc, part);
    if (threadIdx.x == 0) out[0] = total;
}

// flag[0] = 1 when x[0] (a summed loss) is not finite, else 0: the updates of
// a step read it and skip themselves, so the host need not wait for the loss.
// cleared[0] = 0: a flag the rest of the step may set (no memset of its own).
extern "C" __global__ void loss_guard(const double* x, unsigned int* flag, unsigned int* cleared) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        flag[0] = isfinite(x[0]) ? 0u : 1u;
        cleared[0] = 0u;
    }
}
