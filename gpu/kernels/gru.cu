// The elementwise parts of the split GRU cell (operators/src/nn/gru.rs); the
// products with W_ih and W_hh run in cuBLAS.
//
// Gate order r, z, n (torch.nn.GRU). Layouts:
//   gx   [(B * T) x 3H]  x . W_ih^T, batch-major (row b * T + t), no bias;
//   gh   [B x 3H]        h_{t-1} . W_hh^T of the current step, no bias (not
//                        read at t = 0, where h_0 = 0 and the host skips it);
//   r, z, n, hn  [T x B x H] the step's activations and W_hn h + b_hn;
//   states [(T + 1) x B x H] h_0 = 0, h_1 .. h_T;
//   dgx  [(B * T) x 3H] and dgh [T x B x 3H] the pre-activation gradients.
// A row b is inside its sequence at step t when t < lengths[b]; past it the
// row keeps its state and gets no gate gradients. The buffers are reused from
// batch to batch uncleared: the forward's first step writes h_0 = 0 and the
// backward's first (t = T - 1) starts from dh = 0 without reading it. The nonlinearities are the
// CPU's: sigmoid(x) = 1 / (1 + e^-x), tanh(x) = 2 sigmoid(2x) - 1.

__device__ __forceinline__ float gru_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float gru_tanh(float x) { return gru_sigmoid(x + x) * 2.0f - 1.0f; }

// One thread per (b, j) of step t.
extern "C" __global__ void gru_step_forward(const float* gx, const float* gh, const float* b_ih, const float* b_hh,
                                            const unsigned int* lengths, unsigned int t, unsigned int steps,
                                            unsigned int batch, unsigned int h, float* prev, float* out,
                                            float* r, float* z, float* n, float* hn) {
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (unsigned long long)batch * h) return;
    const unsigned int b = (unsigned int)(k / h), j = (unsigned int)(k % h);
    const bool first = t == 0u;
    if (first) prev[k] = 0.0f;
    const float p = first ? 0.0f : prev[k];
    if (t >= lengths[b]) {
        out[k] = p;
        return;
    }
    const unsigned long long h3 = 3ull * h;
    const float* x = gx + ((unsigned long long)b * steps + t) * h3;
    const float* g = gh + (unsigned long long)b * h3;
    const unsigned long long plane = (unsigned long long)t * batch * h + k;
    const float g_r = first ? 0.0f : g[j];
    const float g_z = first ? 0.0f : g[h + j];
    const float g_n = first ? 0.0f : g[2 * h + j];
    const float r_pre = x[j] + g_r + (b_ih[j] + b_hh[j]);
    const float z_pre = x[h + j] + g_z + (b_ih[h + j] + b_hh[h + j]);
    const float n_pre = x[2 * h + j] + b_ih[2 * h + j];
    const float hn_v = g_n + b_hh[2 * h + j];
    const float rv = gru_sigmoid(r_pre);
    const float zv = gru_sigmoid(z_pre);
    const float nv = gru_tanh(n_pre + rv * hn_v);
    r[plane] = rv;
    z[plane] = zv;
    n[plane] = nv;
    hn[plane] = hn_v;
    out[k] = (1.0f - zv) * nv + zv * p;
}

// One thread per (b, j) of step t: with d = dh + dstates_t (dh carried from
// step t + 1), the gate gradients into dgx (row b * T + t) and dgh (plane t),
// and dh_prev = d * z (or d itself past the row's length). The host then adds
// dgh . W_hh into dh_prev.
extern "C" __global__ void gru_step_backward(const float* dh, const float* dstates_t, const float* r,
                                             const float* z, const float* n, const float* hn, const float* prev,
                                             const unsigned int* lengths, unsigned int t, unsigned int steps,
                                             unsigned int batch, unsigned int h, float* dgx, float* dgh,
                                             float* dh_prev) {
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= (unsigned long long)batch * h) return;
    const unsigned int b = (unsigned int)(k / h), j = (unsigned int)(k % h);
    const unsigned long long h3 = 3ull * h;
    float* gx = dgx + ((unsigned long long)b * steps + t) * h3;
    float* gg = dgh + ((unsigned long long)t * batch + b) * h3;
    const float d = (t + 1u == steps ? 0.0f : dh[k]) + dstates_t[k];
    if (t >= lengths[b]) {
        gx[j] = 0.0f;
        gx[h + j] = 0.0f;
        gx[2 * h + j] = 0.0f;
        gg[j] = 0.0f;
        gg[h + j] = 0.0f;
        gg[2 * h + j] = 0.0f;
        dh_prev[k] = d;
        return;
    }
    const unsigned long long plane = (unsigned long long)t * batch * h + k;
    const float rv = r[plane], zv = z[plane], nv = n[plane], hnv = hn[plane];
    const float g_n = d * (1.0f - zv) * (1.0f - nv * nv);
    const float dr = g_n * hnv * rv * (1.0f - rv);
    const float dz = d * (prev[k] - nv) * zv * (1.0f - zv);
    gx[j] = dr;
    gx[h + j] = dz;
    gx[2 * h + j] = g_n;
    gg[j] = dr;
    gg[h + j] = dz;
    gg[2 * h + j] = g_n * rv;
    dh_prev[k] = d * zv;
}
