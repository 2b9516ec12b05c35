// Pooling, entry gradients and the finiteness check of a device-resident
// worker (`resident.rs`): every table lives in one buffer `table`
// ([total rows x dim], table t's rows from its base row on), and a batch's
// entries are global row numbers `rows_of[k]` (base of the field's table + id).
//
// Bags are field-major: bag j = f * batch + b (field f, sample b) holds the
// entries k in [offsets[j], offsets[j + 1]). The pooled output is
// sample-major, as the models read it:
//   pooled[(b * num_fields + f) * dim + c] = sum over k of w_k * table[rows_of[k] * dim + c]
// summed in k order from zero, w_k = weights[k] when `weighted` is non-zero,
// and no product at all otherwise (the CPU's `pool_sum`). An empty bag pools
// to zeros. The host has checked every row number before the launch.

// Thread i's bag j = f * batch + b and column c.
struct BagColumn {
    unsigned long long j;
    unsigned int c, f, b;
};

__device__ __forceinline__ BagColumn bag_column(unsigned long long i, unsigned int dim, unsigned int batch) {
    BagColumn at;
    at.j = i / dim;
    at.c = (unsigned int)(i - at.j * dim);
    at.f = (unsigned int)(at.j / batch);
    at.b = (unsigned int)(at.j - (unsigned long long)at.f * batch);
    return at;
}

// One thread per (bag, column).
extern "C" __global__ void resident_pool(const float* table, unsigned int dim, const unsigned int* offsets,
                                         const unsigned int* rows_of, const float* weights, int weighted,
                                         unsigned int batch, unsigned int num_fields, float* pooled) {
    const unsigned long long n = (unsigned long long)batch * num_fields * dim;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const BagColumn at = bag_column(i, dim, batch);
        float acc = 0.0f;
        for (unsigned int k = offsets[at.j]; k < offsets[at.j + 1]; ++k) {
            const float r = table[(unsigned long long)rows_of[k] * dim + at.c];
            if (weighted) {
                acc += weights[k] * r;
            } else {
                acc += r;
            }
        }
        pooled[((unsigned long long)at.b * num_fields + at.f) * dim + at.c] = acc;
    }
}

// The pooling's adjoint per entry: grads[k * dim + c] = w_k * dpooled[(b * num_fields + f) * dim + c]
// for entry k of bag (f, b) (no product when not weighted). One thread per (bag, column).
extern "C" __global__ void resident_entry_grads(const float* dpooled, unsigned int dim, const unsigned int* offsets,
                                                const float* weights, int weighted, unsigned int batch,
                                                unsigned int num_fields, float* grads) {
    const unsigned long long n = (unsigned long long)batch * num_fields * dim;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const BagColumn at = bag_column(i, dim, batch);
        const float g = dpooled[((unsigned long long)at.b * num_fields + at.f) * dim + at.c];
        for (unsigned int k = offsets[at.j]; k < offsets[at.j + 1]; ++k) {
            grads[(unsigned long long)k * dim + at.c] = weighted ? weights[k] * g : g;
        }
    }
}

// flag[0] = 1 when any of the first n values is infinite or NaN (the flag is
// only ever set, so the launch order of the blocks does not matter).
extern "C" __global__ void flag_nonfinite(const float* x, unsigned long long n, unsigned int* flag) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        if (!isfinite(x[i])) flag[0] = 1u;
    }
}

// Sets bit r % 32 of bits[r / 32] for each of the n row numbers r of rows_of:
// the rows a training step updates, remembered on the device until the host
// reads them back (the bits are only ever set, so the order does not matter).
extern "C" __global__ void mark_rows(const unsigned int* rows_of, unsigned long long n, unsigned int* bits) {
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int r = rows_of[i];
        atomicOr(&bits[r >> 5], 1u << (r & 31u));
    }
}
