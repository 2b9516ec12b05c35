// The home's side of the DES partial exchange for the LR / FM / DeepFM /
// Wide & Deep models, mirroring `tiderec_operators::nn::PartialModel` for
// `Fm`: every sample arrives as its summed partial result
// `p = [c, S_1 .. S_k, z_1 .. z_h]` (`width` values: the FM sums, `1 + k`
// with a second-order term and 1 without (`dim` 0), then the deep part's
// first-layer shares, `hidden` values, when there is a deep part).
//
// fm_partial_logit: one thread per sample, in the CPU's order:
//   logits[b] += p[0] + 0.5 * sum_c S_c^2 (the squares added in column order).
// fm_partial_grad: one thread per FM column: [g, g * S_1 .. g * S_k].
// shares_plus_bias: z[b, o] = p[b, offset + o] + bias[o] (the first layer's
//   pre-activation before the dense columns' product is added).
// relu_rows: z = max(z, 0), a negative zero made positive, as `bias_act_rows`.
// shares_grad: dp[b, offset + o] = dz[b, o].

extern "C" __global__ void fm_partial_logit(const float* partial, unsigned int batch, unsigned int width,
                                            unsigned int dim, float* logits) {
    const unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const float* p = partial + b * width;
    float l = p[0];
    if (dim > 0) {
        float total = 0.0f;
        for (unsigned int c = 0; c < dim; ++c) total += p[1 + c] * p[1 + c];
        l += 0.5f * total;
    }
    logits[b] += l;
}

extern "C" __global__ void fm_partial_grad(const float* partial, const float* dlogits, unsigned int batch,
                                           unsigned int width, unsigned int dim, float* dpartial) {
    const unsigned long long cols = (unsigned long long)dim + 1;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols * batch) return;
    const unsigned long long b = i / cols, c = i % cols;
    const float g = dlogits[b];
    const unsigned long long at = b * width + c;
    dpartial[at] = c == 0 ? g : g * partial[at];
}

extern "C" __global__ void shares_plus_bias(const float* partial, const float* bias, unsigned int batch,
                                            unsigned int width, unsigned int offset, unsigned int hidden, float* z) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * hidden) return;
    const unsigned long long b = i / hidden, o = i % hidden;
    z[i] = partial[b * width + offset + o] + bias[o];
}

extern "C" __global__ void relu_rows(float* z, unsigned long long n) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float v = z[i];
    z[i] = v < 0.0f ? 0.0f : v + 0.0f;
}

extern "C" __global__ void shares_grad(const float* dz, unsigned int batch, unsigned int width, unsigned int offset,
                                       unsigned int hidden, float* dpartial) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * hidden) return;
    const unsigned long long b = i / hidden, o = i % hidden;
    dpartial[b * width + offset + o] = dz[i];
}
