// Dense optimizers over one parameter slice, elementwise, with the formulas
// and evaluation order of `DenseOptimizer::update_range` in
// operators/src/optim.rs (the kernels are compiled without FMA contraction,
// so each product and sum rounds as on the CPU). `g` is the gradient before
// averaging; `scale` averages it inside the update. What changes from step to
// step is read from device memory, `hyper`, written by `write_scalars` before
// the update is queued (so a captured CUDA graph replays with each step's values):
// SGD's and Adagrad's learning rate `hyper[0]`; Adam's bias-corrected step
// `hyper[0] = lr / (1 - beta1^t)` and `hyper[1] = sqrt(1 - beta2^t)`, computed
// on the host exactly as the CPU computes them. Each kernel first reads
// `skip[0]`: when it is not zero (the step's loss was not finite) nothing is updated.

// Writes one step's scalars where the update kernels read them (one thread).
extern "C" __global__ void write_scalars(float* out, float a, float b) {
    out[0] = a;
    out[1] = b;
}

extern "C" __global__ void sgd_update(const unsigned int* skip, const float* hyper, float* p, const float* g,
                                      unsigned long long n, float scale) {
    if (skip[0] != 0u) return;
    const float lr = hyper[0];
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        p[i] -= lr * (g[i] * scale);
    }
}

extern "C" __global__ void adagrad_update(const unsigned int* skip, const float* hyper, float* p, const float* g,
                                          float* v, unsigned long long n, float eps, float scale) {
    if (skip[0] != 0u) return;
    const float lr = hyper[0];
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float gi = g[i] * scale;
        const float vi = v[i] + gi * gi;
        v[i] = vi;
        p[i] -= lr * gi / (sqrtf(vi) + eps);
    }
}

extern "C" __global__ void adam_update(const unsigned int* skip, const float* hyper, float* p, const float* g,
                                       float* m, float* v, unsigned long long n, float beta1, float beta2,
                                       float one_minus_beta1, float one_minus_beta2, float eps, float scale) {
    if (skip[0] != 0u) return;
    const float step = hyper[0], bc2_sqrt = hyper[1];
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float gi = g[i] * scale;
        const float mi = beta1 * m[i] + one_minus_beta1 * gi;
        const float vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] -= step * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}
