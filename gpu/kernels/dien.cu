// The reshaping around DIEN's GRU, attention and MLP, mirroring
// `tiderec_operators::nn::dien::Dien` (E = S * D: the S sequence fields'
// rows of width D side by side; F pooled fields of width D per sample;
// sequences [B x T x E] batch-major, GRU states [(T + 1) x B x E] time-major).
// Every thread owns one output value and sums in the CPU's order.

// query[b, s*D + c] = pooled[b, targets[s], c]
extern "C" __global__ void dien_query(const float* pooled, const unsigned int* targets, unsigned int batch,
                                      unsigned int fields, unsigned int dim, unsigned int seqs, float* query) {
    const unsigned long long e = (unsigned long long)seqs * dim;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= e * batch) return;
    const unsigned long long b = i / e, s = (i % e) / dim, c = i % dim;
    query[i] = pooled[(b * fields + targets[s]) * dim + c];
}

// interest[b, k] = sum over t < lengths[b] of seq[b, t, k]
extern "C" __global__ void dien_sum_pool(const float* seq, const unsigned int* lengths, unsigned int batch,
                                         unsigned int steps, unsigned int e, float* interest) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * e) return;
    const unsigned long long b = i / e, k = i % e;
    float acc = 0.0f;
    for (unsigned int t = 0; t < lengths[b]; ++t) acc += seq[(b * steps + t) * e + k];
    interest[i] = acc;
}

// keys[b, t, k] = states[t + 1, b, k] + seq[b, t, k]
extern "C" __global__ void dien_keys(const float* states, const float* seq, unsigned int batch, unsigned int steps,
                                     unsigned int e, float* keys) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * steps * e) return;
    const unsigned long long b = i / ((unsigned long long)steps * e), t = (i / e) % steps, k = i % e;
    keys[i] = states[((t + 1) * batch + b) * e + k] + seq[i];
}

// The MLP input [x, pooled, u, u * q] per sample (width nd + fd + 2e, fd = F * D).
extern "C" __global__ void dien_mlp_input(const float* dense, const float* pooled, const float* interest,
                                          const float* query, unsigned int batch, unsigned int nd, unsigned int fd,
                                          unsigned int e, float* out) {
    const unsigned long long w = (unsigned long long)nd + fd + 2ull * e;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= w * batch) return;
    const unsigned long long b = i / w, c = i % w;
    float v;
    if (c < nd) {
        v = dense[b * nd + c];
    } else if (c < nd + fd) {
        v = pooled[b * fd + (c - nd)];
    } else if (c < nd + fd + e) {
        v = interest[b * e + (c - nd - fd)];
    } else {
        const unsigned long long k = c - nd - fd - e;
        v = interest[b * e + k] * query[b * e + k];
    }
    out[i] = v;
}

// dpooled[b, c] = dx[b, nd + c] (overwritten), c < fd.
extern "C" __global__ void dien_dx_pooled(const float* dx, unsigned int batch, unsigned int nd, unsigned int fd,
                                          unsigned int e, float* dpooled) {
    const unsigned long long w = (unsigned long long)nd + fd + 2ull * e;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * fd) return;
    const unsigned long long b = i / fd, c = i % fd;
    dpooled[i] = dx[b * w + nd + c];
}

// dinterest = du + dprod * q, dquery = dprod * u (both overwritten).
extern "C" __global__ void dien_dx_interest(const float* dx, const float* interest, const float* query,
                                            unsigned int batch, unsigned int nd, unsigned int fd, unsigned int e,
                                            float* dinterest, float* dquery) {
    const unsigned long long w = (unsigned long long)nd + fd + 2ull * e;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * e) return;
    const unsigned long long b = i / e, k = i % e;
    const float du = dx[b * w + nd + fd + k], dprod = dx[b * w + nd + fd + e + k];
    dinterest[i] = du + dprod * query[i];
    dquery[i] = dprod * interest[i];
}

// dseq[b, t, k] = dinterest[b, k] inside the sequence, 0 on padding (overwritten).
extern "C" __global__ void dien_sum_pool_backward(const float* dinterest, const unsigned int* lengths,
                                                  unsigned int batch, unsigned int steps, unsigned int e,
                                                  float* dseq) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * steps * e) return;
    const unsigned long long b = i / ((unsigned long long)steps * e), t = (i / e) % steps, k = i % e;
    dseq[i] = t < lengths[b] ? dinterest[b * e + k] : 0.0f;
}

// dstates[t, b, k] = dkeys[b, t, k] (batch-major to time-major).
extern "C" __global__ void dien_keys_to_states(const float* dkeys, unsigned int batch, unsigned int steps,
                                               unsigned int e, float* dstates) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * steps * e) return;
    const unsigned long long b = i / ((unsigned long long)steps * e), t = (i / e) % steps, k = i % e;
    dstates[(t * batch + b) * e + k] = dkeys[i];
}

// The keys' residual path: dseq[b, t, k] += dkeys[b, t, k] inside the sequence.
extern "C" __global__ void dien_residual(const float* dkeys, const unsigned int* lengths, unsigned int batch,
                                         unsigned int steps, unsigned int e, float* dseq) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * steps * e) return;
    const unsigned long long b = i / ((unsigned long long)steps * e), t = (i / e) % steps;
    if (t < lengths[b]) dseq[i] += dkeys[i];
}

// dpooled[b, targets[s], c] += dquery[b, s*D + c], the targets in order (one thread per (b, c)).
extern "C" __global__ void dien_target_grad(const float* dquery, const unsigned int* targets, unsigned int batch,
                                            unsigned int fields, unsigned int dim, unsigned int seqs,
                                            float* dpooled) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (unsigned long long)batch * dim) return;
    const unsigned long long b = i / dim, c = i % dim;
    for (unsigned int s = 0; s < seqs; ++s) {
        dpooled[(b * fields + targets[s]) * dim + c] += dquery[(b * seqs + s) * dim + c];
    }
}
