// The linear ("wide") part of the LR / FM / DeepFM / Wide & Deep model and the
// reshaping between its pooled rows and the deep part's input, mirroring
// `tiderec_operators::nn::deepfm::Fm`. Every pooled row is `[w, v_1 .. v_k]`
// (stride `e = 1 + k`), `num_fields` rows per sample.
//
// wide_forward: one thread per sample, in the CPU's order: the bias, the dense
//   products in column order, then the first-order weights in field order.
// first_order_grad: overwrites the pooled gradient: the first-order slot of
//   every row gets the sample's logit gradient, the factor slots zero.
// deep_input_gather / deep_input_scatter_add: `[x, v_1 .. v_fd]` per sample
//   from the dense values and the factors of the first `fd` fields, and the
//   gradient of that input added back onto the factors.
// add_assign: a[i] += b[i].

extern "C" __global__ void wide_forward(const float* dense, const float* pooled, const float* params,
                                        unsigned int batch, unsigned int num_dense, unsigned int num_fields,
                                        unsigned int stride, float* logits) {
    const unsigned int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    float dot = 0.0f;
    for (unsigned int j = 0; j < num_dense; ++j) dot += dense[(unsigned long long)b * num_dense + j] * params[1 + j];
    float l = params[0] + dot;
    for (unsigned int f = 0; f < num_fields; ++f) l += pooled[((unsigned long long)b * num_fields + f) * stride];
    logits[b] = l;
}

extern "C" __global__ void first_order_grad(const float* dlogits, unsigned int batch, unsigned int num_fields,
                                            unsigned int stride, float* dpooled) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long per_sample = (unsigned long long)num_fields * stride;
    if (i >= per_sample * batch) return;
    const unsigned long long b = i / per_sample;
    dpooled[i] = (i % stride == 0) ? dlogits[b] : 0.0f;
}

extern "C" __global__ void deep_input_gather(const float* dense, const float* pooled, unsigned int batch,
                                             unsigned int num_dense, unsigned int num_fields, unsigned int deep_fields,
                                             unsigned int dim, unsigned int stride, float* out) {
    const unsigned long long width = (unsigned long long)num_dense + (unsigned long long)deep_fields * dim;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width * batch) return;
    const unsigned long long b = i / width, c = i % width;
    if (c < num_dense) {
        out[i] = dense[b * num_dense + c];
    } else {
        const unsigned long long f = (c - num_dense) / dim, k = (c - num_dense) % dim;
        out[i] = pooled[(b * num_fields + f) * stride + 1 + k];
    }
}

extern "C" __global__ void deep_input_scatter_add(const float* d_in, unsigned int batch, unsigned int num_dense,
                                                  unsigned int num_fields, unsigned int deep_fields, unsigned int dim,
                                                  unsigned int stride, float* dpooled) {
    const unsigned long long n = (unsigned long long)deep_fields * dim;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * batch) return;
    const unsigned long long b = i / n, f = (i % n) / dim, k = i % dim;
    const unsigned long long width = (unsigned long long)num_dense + n;
    dpooled[(b * num_fields + f) * stride + 1 + k] += d_in[b * width + num_dense + f * dim + k];
}

extern "C" __global__ void add_assign(float* a, const float* b, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}
