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

// out[0] = sum over i of max(x, 0) - x * y + ln(1 + e^-|x|), in fp64. One
// block of 256 threads: thread t sums i = t, t + 256, ... in order, then the
// 256 partial sums are added pairwise in a fixed tree, so the result is the
// same on every run.
extern "C" __global__ void bce_sum(const float* logits, const float* labels, unsigned long long n, double* out) {
    __shared__ double part[256];
    double acc = 0.0;
    for (unsigned long long i = threadIdx.x; i < n; i += 256) {
        const double x = (double)logits[i];
        acc += fmax(x, 0.0) - x * (double)labels[i] + log1p(exp(-fabs(x)));
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (unsigned int half = 128; half > 0; half >>= 1) {
        if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[0] = part[0];
}
