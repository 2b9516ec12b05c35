// Bilinear softmax attention pooling (operators/src/nn/attention.rs), one
// block per sample. For sample b with query q, keys k_0 .. k_{L-1} (the first
// L = min(lengths[b], T) of T padded positions) and W (D x D):
//   wq = W q;  s_t = <k_t, wq>;  alpha = softmax(s);  out = sum_t alpha_t k_t
// (an empty sequence pools to zeros). Every sum runs in the CPU's order.
// Shared memory: D + T floats.

extern "C" __global__ void attention_forward(const float* w, const float* query, const float* keys,
                                             const unsigned int* lengths, unsigned int batch, unsigned int steps,
                                             unsigned int d, float* out, float* alpha_out, float* wq_out) {
    extern __shared__ float smem[];
    float* wq = smem;
    float* alpha = smem + d;
    __shared__ float total;
    const unsigned int b = blockIdx.x;
    if (b >= batch) return;
    const float* q = query + (unsigned long long)b * d;
    const float* kb = keys + (unsigned long long)b * steps * d;
    const unsigned int len = min(lengths[b], steps);
    for (unsigned int i = threadIdx.x; i < d; i += blockDim.x) {
        float s = 0.0f;
        for (unsigned int j = 0; j < d; ++j) s += w[(unsigned long long)i * d + j] * q[j];
        wq[i] = s;
        wq_out[(unsigned long long)b * d + i] = s;
    }
    __syncthreads();
    for (unsigned int t = threadIdx.x; t < steps; t += blockDim.x) {
        float s = 0.0f;
        if (t < len) {
            for (unsigned int c = 0; c < d; ++c) s += kb[(unsigned long long)t * d + c] * wq[c];
        }
        alpha[t] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0 && len > 0) {
        float m = alpha[0];
        for (unsigned int t = 1; t < len; ++t) {
            const float s = alpha[t];
            m = m >= s ? m : s;
        }
        float sum = 0.0f;
        for (unsigned int t = 0; t < len; ++t) {
            const float e = expf(alpha[t] - m);
            alpha[t] = e;
            sum += e;
        }
        total = sum;
    }
    __syncthreads();
    for (unsigned int t = threadIdx.x; t < steps; t += blockDim.x) {
        const float a = t < len ? alpha[t] / total : 0.0f;
        alpha[t] = a;
        alpha_out[(unsigned long long)b * steps + t] = a;
    }
    __syncthreads();
    for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) {
        float o = 0.0f;
        for (unsigned int t = 0; t < len; ++t) o += alpha[t] * kb[(unsigned long long)t * d + c];
        out[(unsigned long long)b * d + c] = o;
    }
}

// dkeys (overwritten, zero past the length) and kbar = sum_t ds_t k_t per
// sample ([batch x D]), where da_t = <g, k_t> and ds_t = alpha_t (da_t - sum_u alpha_u da_u).
// The host finishes with dquery = kbar . W and dW = kbar^T . query.
// Shared memory: T floats.
extern "C" __global__ void attention_backward(const float* keys, const unsigned int* lengths, const float* dout,
                                              const float* alpha, const float* wq, unsigned int batch,
                                              unsigned int steps, unsigned int d, float* dkeys, float* kbar) {
    extern __shared__ float ds[];
    __shared__ float mean;
    const unsigned int b = blockIdx.x;
    if (b >= batch) return;
    const float* g = dout + (unsigned long long)b * d;
    const float* kb = keys + (unsigned long long)b * steps * d;
    const float* al = alpha + (unsigned long long)b * steps;
    const float* wqb = wq + (unsigned long long)b * d;
    const unsigned int len = min(lengths[b], steps);
    for (unsigned int t = threadIdx.x; t < len; t += blockDim.x) {
        float da = 0.0f;
        for (unsigned int c = 0; c < d; ++c) da += g[c] * kb[(unsigned long long)t * d + c];
        ds[t] = da;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = 0.0f;
        for (unsigned int t = 0; t < len; ++t) m += al[t] * ds[t];
        mean = m;
    }
    __syncthreads();
    for (unsigned int t = threadIdx.x; t < len; t += blockDim.x) ds[t] = al[t] * (ds[t] - mean);
    __syncthreads();
    float* dk = dkeys + (unsigned long long)b * steps * d;
    for (unsigned long long k = threadIdx.x; k < (unsigned long long)steps * d; k += blockDim.x) {
        const unsigned int t = (unsigned int)(k / d), c = (unsigned int)(k % d);
        dk[k] = t < len ? al[t] * g[c] + ds[t] * wqb[c] : 0.0f;
    }
    for (unsigned int c = threadIdx.x; c < d; c += blockDim.x) {
        float s = 0.0f;
        for (unsigned int t = 0; t < len; ++t) s += ds[t] * kb[(unsigned long long)t * d + c];
        kbar[(unsigned long long)b * d + c] = s;
    }
}
