// DLRM's dot interaction, one warp per sample, blockDim.x / 32 samples a block.
//
// Per sample the vectors are z_0 = dense[b] (the bottom MLP's output) and
// z_1..z_F = pooled[b, f] (the pooled embeddings), n = F + 1 vectors of width
// d. The output row is z_0 followed by the dot products <z_i, z_j> in the
// order of the pair table (`pair_i`, `pair_j`, built on the host in the CPU's
// order: lower triangle row by row, the diagonal inside each row with
// self-interaction, <z_0, z_0> last). Each dot product is a chain of fused
// multiply-adds over c = 0..d-1 in order, as the CPU's definition is (fmaf:
// the kernels are compiled with --fmad=false, so nothing else is fused).
//
// Each warp owns a slice of shared memory: z (n rows of d floats, d | 1
// apart, so that the lanes reading different rows at one column hit
// different banks) in the forward; z (n * d floats) and the symmetric pair
// gradient S (n * n floats) in the backward. The host sizes the block so that
// every warp's slice fits. A warp past the batch returns at once; the others
// synchronise with __syncwarp only, so no warp waits for another.

extern "C" __global__ void interaction_forward(const float* dense, const float* pooled, const unsigned int* pair_i,
                                               const unsigned int* pair_j, unsigned int batch, unsigned int num_sparse,
                                               unsigned int d, unsigned int num_pairs, float* out) {
    extern __shared__ float smem[];
    const unsigned int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= batch) return;
    const unsigned int n = num_sparse + 1;
    const unsigned int ld = d | 1;
    float* z = smem + (unsigned long long)warp * n * ld;
    const unsigned long long od = (unsigned long long)d + num_pairs;
    const unsigned long long fd = (unsigned long long)num_sparse * d;
    const float* zd = dense + (unsigned long long)b * d;
    const float* zp = pooled + (unsigned long long)b * fd;
    for (unsigned int k = lane; k < n * d; k += 32) {
        const unsigned int r = k / d, c = k - r * d;
        z[r * ld + c] = k < d ? zd[k] : zp[k - d];
    }
    __syncwarp();
    float* row = out + (unsigned long long)b * od;
    for (unsigned int k = lane; k < d; k += 32) {
        row[k] = z[k];
    }
    for (unsigned int p = lane; p < num_pairs; p += 32) {
        const float* zi = z + pair_i[p] * ld;
        const float* zj = z + pair_j[p] * ld;
        float acc = 0.0f;
        for (unsigned int c = 0; c < d; ++c) {
            acc = fmaf(zi[c], zj[c], acc);
        }
        row[d + p] = acc;
    }
}

// ddense[b] and dpooled[b] (overwritten) from dout[b]: dZ = S . Z plus dout's
// copy of z_0 on row 0, where S[i][j] = S[j][i] = dout of pair (i, j) and a
// diagonal pair counts twice. Each element of dZ sums j = 0..n-1 in order,
// then adds the copied gradient, as the CPU does.
extern "C" __global__ void interaction_backward(const float* dense, const float* pooled, const float* dout,
                                                const unsigned int* pair_i, const unsigned int* pair_j,
                                                unsigned int batch, unsigned int num_sparse, unsigned int d,
                                                unsigned int num_pairs, float* ddense, float* dpooled) {
    extern __shared__ float smem[];
    const unsigned int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= batch) return;
    const unsigned int n = num_sparse + 1;
    float* z = smem + (unsigned long long)warp * (n * d + n * n);
    float* s = z + n * d;
    const unsigned long long od = (unsigned long long)d + num_pairs;
    const unsigned long long fd = (unsigned long long)num_sparse * d;
    const float* g = dout + (unsigned long long)b * od;
    const float* zd = dense + (unsigned long long)b * d;
    const float* zp = pooled + (unsigned long long)b * fd;
    for (unsigned int k = lane; k < n * d; k += 32) {
        z[k] = k < d ? zd[k] : zp[k - d];
    }
    for (unsigned int k = lane; k < n * n; k += 32) {
        s[k] = 0.0f;
    }
    __syncwarp();
    for (unsigned int p = lane; p < num_pairs; p += 32) {
        const unsigned int i = pair_i[p], j = pair_j[p];
        const float v = g[d + p];
        if (i == j) {
            s[i * n + i] = v + v;
        } else {
            s[i * n + j] = v;
            s[j * n + i] = v;
        }
    }
    __syncwarp();
    float* gd = ddense + (unsigned long long)b * d;
    float* gp = dpooled + (unsigned long long)b * fd;
    for (unsigned int k = lane; k < n * d; k += 32) {
        const unsigned int r = k / d, c = k - r * d;
        const float* sr = s + r * n;
        float acc = 0.0f;
        for (unsigned int j = 0; j < n; ++j) {
            acc = fmaf(sr[j], z[j * d + c], acc);
        }
        if (r == 0) {
            gd[c] = acc + g[c];
        } else {
            gp[k - d] = acc;
        }
    }
}
