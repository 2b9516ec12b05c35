// A stable least-significant-digit radix sort of u32 keys carrying u32
// values, 8 bits per pass, and the checks and helpers around it. It groups
// duplicate ids (embedding rows) so that each distinct row is reduced by one
// warp in the order its entries had: every pass is stable, so equal keys keep
// their input order.
//
// One pass over n keys with `tiles` blocks of `tile` keys each:
//   radix_histogram: hist[digit * tiles + block] = count of the digit in the tile;
//   scan_segments_u32, exclusive_scan_u32, add_segment_bases_u32: hist becomes the
//     first output position of each (digit, tile): each digit's tiles scanned by
//     one block, the digits' totals scanned, each digit's base added;
//   radix_scatter: each tile writes its keys in order, 256 at a time, ranking
//     equal digits inside a warp with __match_any_sync (compute capability 7.0+)
//     and across the block's 8 warps with per-warp counts in shared memory.
// radix_histogram and radix_scatter use 256 threads per block (the host enforces it).

#define RADIX 256
#define WARPS 8

// out[i] = i for i < n.
extern "C" __global__ void iota_u32(unsigned int* out, unsigned int n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = (unsigned int)i;
    }
}

// first_bad[0] = the smallest position i with keys[i] >= bound (unchanged when
// none; the host initialises it to 0xffffffff). atomicMin keeps the result
// independent of the order threads run in.
extern "C" __global__ void check_below(const unsigned int* keys, unsigned int n, unsigned int bound,
                                       unsigned int* first_bad) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (keys[i] >= bound) atomicMin(first_bad, (unsigned int)i);
    }
}

// first_bad[0] = the smallest bag b whose offsets are not ordered
// (offsets[b] > offsets[b + 1]) or run past `len` entries; offsets has batch + 1 values.
extern "C" __global__ void check_offsets(const unsigned int* offsets, unsigned int batch, unsigned int len,
                                         unsigned int* first_bad) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; b < batch; b += stride) {
        const unsigned int lo = offsets[b], hi = offsets[b + 1];
        if (lo > hi || hi > len || (b == 0 && lo != 0)) atomicMin(first_bad, (unsigned int)b);
    }
}

extern "C" __global__ void radix_histogram(const unsigned int* keys, unsigned int n, unsigned int shift,
                                           unsigned int tile, unsigned int tiles, unsigned int* hist) {
    __shared__ unsigned int counts[RADIX];
    for (unsigned int k = threadIdx.x; k < RADIX; k += blockDim.x) counts[k] = 0;
    __syncthreads();
    const unsigned long long start = (unsigned long long)blockIdx.x * tile;
    const unsigned long long end = min(start + tile, (unsigned long long)n);
    for (unsigned long long i = start + threadIdx.x; i < end; i += blockDim.x) {
        atomicAdd(&counts[(keys[i] >> shift) & (RADIX - 1)], 1u);
    }
    __syncthreads();
    for (unsigned int k = threadIdx.x; k < RADIX; k += blockDim.x) {
        hist[(unsigned long long)k * tiles + blockIdx.x] = counts[k];
    }
}

// In-place exclusive prefix sum of data[0..len) by one block (blockDim.x a
// multiple of 32, at most 1024); returns the total to every thread. Thread t
// scans its own contiguous run of values, the runs' totals are scanned across
// the block with warp shuffles, and each thread writes its run's prefix sums.
__device__ unsigned int block_exclusive_scan(unsigned int* data, unsigned int len) {
    __shared__ unsigned int warp_total[33];
    const unsigned int t = threadIdx.x, lane = t & 31, warp = t >> 5, warps = blockDim.x >> 5;
    const unsigned long long per = ((unsigned long long)len + blockDim.x - 1) / blockDim.x;
    const unsigned long long lo0 = t * per;
    const unsigned int lo = (unsigned int)(lo0 < len ? lo0 : len);
    const unsigned int hi = (unsigned int)(lo0 + per < len ? lo0 + per : len);
    unsigned int sum = 0;
    for (unsigned int i = lo; i < hi; ++i) sum += data[i];
    unsigned int inclusive = sum;
    for (unsigned int off = 1; off < 32; off <<= 1) {
        const unsigned int v = __shfl_up_sync(0xffffffffu, inclusive, off);
        if (lane >= off) inclusive += v;
    }
    if (lane == 31) warp_total[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
        const unsigned int x = lane < warps ? warp_total[lane] : 0;
        unsigned int y = x;
        for (unsigned int off = 1; off < 32; off <<= 1) {
            const unsigned int v = __shfl_up_sync(0xffffffffu, y, off);
            if (lane >= off) y += v;
        }
        if (lane < warps) warp_total[lane] = y - x;
        if (lane == 31) warp_total[32] = y;
    }
    __syncthreads();
    unsigned int run = warp_total[warp] + inclusive - sum;
    for (unsigned int i = lo; i < hi; ++i) {
        const unsigned int v = data[i];
        data[i] = run;
        run += v;
    }
    return warp_total[32];
}

// In-place exclusive prefix sum of data[0..len), one block.
extern "C" __global__ void exclusive_scan_u32(unsigned int* data, unsigned int len) {
    block_exclusive_scan(data, len);
}

// Block k: the in-place exclusive prefix sum of segment k, data[k * len, (k + 1) * len),
// and its total in totals[k]. One block per segment.
extern "C" __global__ void scan_segments_u32(unsigned int* data, unsigned int len, unsigned int* totals) {
    const unsigned int total = block_exclusive_scan(data + (unsigned long long)blockIdx.x * len, len);
    if (threadIdx.x == 0) totals[blockIdx.x] = total;
}

// data[k] += bases[k / len] for k < segments * len.
extern "C" __global__ void add_segment_bases_u32(unsigned int* data, unsigned int len, unsigned int segments,
                                                 const unsigned int* bases) {
    const unsigned long long n = (unsigned long long)len * segments;
    for (unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; k < n;
         k += (unsigned long long)gridDim.x * blockDim.x) {
        data[k] += bases[k / len];
    }
}

extern "C" __global__ void radix_scatter(const unsigned int* keys_in, const unsigned int* vals_in, unsigned int n,
                                         unsigned int shift, unsigned int tile, unsigned int tiles,
                                         const unsigned int* offsets, unsigned int* keys_out,
                                         unsigned int* vals_out) {
    __shared__ unsigned int running[RADIX];
    __shared__ unsigned int warp_counts[WARPS][RADIX];
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (unsigned int k = threadIdx.x; k < RADIX; k += blockDim.x) {
        running[k] = offsets[(unsigned long long)k * tiles + blockIdx.x];
    }
    const unsigned long long start = (unsigned long long)blockIdx.x * tile;
    const unsigned long long end = min(start + tile, (unsigned long long)n);
    const unsigned int lanes_below = (1u << lane) - 1u;
    for (unsigned long long base = start; base < end; base += blockDim.x) {
        for (unsigned int k = threadIdx.x; k < WARPS * RADIX; k += blockDim.x) {
            warp_counts[k / RADIX][k % RADIX] = 0;
        }
        __syncthreads();
        const unsigned long long i = base + threadIdx.x;
        const bool valid = i < end;
        const unsigned int key = valid ? keys_in[i] : 0;
        // Lanes past the end share a digit no key has, so they match only each other.
        const unsigned int digit = valid ? (key >> shift) & (RADIX - 1) : RADIX;
        const unsigned int peers = __match_any_sync(0xffffffffu, digit);
        const unsigned int rank = __popc(peers & lanes_below);
        if (valid && rank == 0) warp_counts[warp][digit] = __popc(peers);
        __syncthreads();
        if (valid) {
            unsigned int pos = running[digit] + rank;
            for (unsigned int w = 0; w < warp; ++w) pos += warp_counts[w][digit];
            keys_out[pos] = key;
            vals_out[pos] = vals_in[i];
        }
        __syncthreads();
        for (unsigned int k = threadIdx.x; k < RADIX; k += blockDim.x) {
            unsigned int total = 0;
            for (unsigned int w = 0; w < WARPS; ++w) total += warp_counts[w][k];
            running[k] += total;
        }
        __syncthreads();
    }
}
