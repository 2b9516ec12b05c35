// Elementwise and reduction kernels of the fully connected layers; the
// products themselves run in cuBLAS sgemm (exact fp32).
//
// Layouts are row-major: `y` is [rows x cols], `b` is [cols].
// Every index is computed in 64 bits; every thread checks its bounds.

// y[r, c] = act(y[r, c] + b[c]) after `y = x . W^T` (the bias add and the
// ReLU fused into one pass). The ReLU is the CPU's: a negative value becomes
// zero, everything else (zero, positive, NaN) is kept, -0 becomes +0.
extern "C" __global__ void bias_act_rows(float* y, const float* b, unsigned int rows, unsigned int cols, int relu) {
    const unsigned long long n = (unsigned long long)rows * cols;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int c = (unsigned int)(i % cols);
        float v = y[i] + b[c];
        if (relu) {
            v = v < 0.0f ? 0.0f : v + 0.0f;
        }
        y[i] = v;
    }
}

// g[i] = out[i] <= 0 ? 0 : g[i] (the CPU's ReLU backward; NaN outputs pass the gradient).
extern "C" __global__ void relu_backward(float* g, const float* out, unsigned long long n) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const float x = g[i];
        g[i] = out[i] <= 0.0f ? 0.0f : x + 0.0f;
    }
}

// Column reductions in a fixed order, in two passes so that long columns
// spread over the whole device:
//   column_reduce_chunks: partial[k * cols + c] = sum over r in chunk k of
//     w[r] * a[r, c] (no product when w is not used), chunk k holding rows
//     [k * chunk_rows, (k + 1) * chunk_rows). Block (32, 8): the 32 threads of
//     a warp take 32 adjacent columns, the 8 warps rows ty, ty + 8, ... of the
//     chunk; the 8 partial sums are then added in warp order.
//   column_reduce_finish: out[c] = the chunks' partial sums of column c, added in chunk order.
// The result is the same on every run.
extern "C" __global__ void column_reduce_chunks(const float* a, const float* w, int weighted, unsigned int rows,
                                                unsigned int cols, unsigned int chunk_rows, float* partial) {
    __shared__ float part[8][33];
    const unsigned int c = blockIdx.x * 32 + threadIdx.x;
    const unsigned long long lo = (unsigned long long)blockIdx.y * chunk_rows;
    const unsigned long long hi = min(lo + chunk_rows, (unsigned long long)rows);
    float acc = 0.0f;
    if (c < cols) {
        for (unsigned long long r = lo + threadIdx.y; r < hi; r += 8) {
            const float x = a[r * cols + c];
            if (weighted) {
                acc += x * w[r];
            } else {
                acc += x;
            }
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float total = part[0][threadIdx.x];
        for (int k = 1; k < 8; ++k) {
            total += part[k][threadIdx.x];
        }
        partial[(unsigned long long)blockIdx.y * cols + c] = total;
    }
}

extern "C" __global__ void column_reduce_finish(const float* partial, unsigned int chunks, unsigned int cols,
                                                float* out) {
    const unsigned int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float total = partial[c];
    for (unsigned int k = 1; k < chunks; ++k) total += partial[(unsigned long long)k * cols + c];
    out[c] = total;
}
