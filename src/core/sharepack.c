/*
 * How well a run packed its GPU shares, measured against what any placement
 * of the same shares could do.
 *
 * The shares a run placed are items of size 1..999 milli; each GPU is a bin
 * of 1000. Nodes, CPU, memory and GPU models are dropped, which can only
 * lower the bins needed, so a lower bound of this bin-packing problem is a
 * lower bound on the GPUs any policy needs to hold these same shares. The
 * bound is the best of three classical ones: the total size (L1), Martello
 * and Toth's L2 (items over half a GPU each need their own GPU; what is left
 * of those GPUs may take the medium items), and Fekete and Schepers' dual
 * feasible functions u^(k), k = 1..KMAX (items rounded up or down to
 * multiples of 1/k so that any set fitting a GPU still sums to at most 1).
 * Best-fit decreasing gives an offline packing of the same items to compare.
 */
#include <stdint.h>
#include <string.h>

#include "core.h"

#define KMAX 40

/* L2 for every threshold K in 0..C/2, over the histogram. */
static long lower_bound_l2(const long *h)
{
    const int c = KGPU_MILLI;
    const int n = KGPU_MILLI; /* prefix counts and sizes so each K costs O(1) */
    long cnt[KGPU_MILLI + 1];
    int64_t sum[KGPU_MILLI + 1];
    cnt[0] = 0;
    sum[0] = 0;
    for (int s = 1; s <= n; s++) {
        long k = s < n ? h[s] : 0;
        cnt[s] = cnt[s - 1] + k;
        sum[s] = sum[s - 1] + (int64_t)k * s;
    }
    long best = 0;
    for (int K = 0; K <= c / 2; K++) {
        /* J1: s > c-K; J2: c/2 < s <= c-K; J3: K <= s <= c/2 (sizes 1..999 only). */
        int hi = c - K < n - 1 ? c - K : n - 1;
        long j1 = cnt[n - 1] - cnt[hi];
        long j2 = cnt[hi] - cnt[c / 2];
        int64_t s2 = sum[hi] - sum[c / 2];
        int lo = K > 1 ? K : 1;
        int64_t s3 = sum[c / 2] - sum[lo - 1];
        int64_t room = (int64_t)j2 * c - s2;
        int64_t extra = s3 > room ? (s3 - room + c - 1) / c : 0;
        long l = j1 + j2 + (long)extra;
        if (l > best)
            best = l;
    }
    return best;
}

/* ceil(sum of u^(k)(s / C)) for the best k: in units of 1/(C k), exact in integers. */
static long lower_bound_dff(const long *h)
{
    const int64_t c = KGPU_MILLI;
    long best = 0;
    for (int64_t k = 1; k <= KMAX; k++) {
        int64_t total = 0; /* in units of 1 / (c k) */
        for (int s = 1; s < KGPU_MILLI; s++) {
            if (h[s] == 0)
                continue;
            int64_t v = ((k + 1) * s) % c == 0 ? s * k : ((k + 1) * s / c) * c;
            total += v * h[s];
        }
        long l = (long)((total + c * k - 1) / (c * k));
        if (l > best)
            best = l;
    }
    return best;
}

long kgpu__share_lower_bound(const long *h)
{
    long a = lower_bound_l2(h), b = lower_bound_dff(h);
    return a > b ? a : b;
}

long kgpu__share_bfd(const long *h)
{
    /* Bins by free milli: best fit only needs how many bins have each level. */
    const int n = KGPU_MILLI;
    long level[KGPU_MILLI + 1];
    memset(level, 0, sizeof(level));
    long bins = 0;
    for (int s = n - 1; s >= 1; s--) {
        for (long i = 0; i < h[s]; i++) {
            int f = s;
            while (f < n && level[f] == 0)
                f++;
            if (f < n) {
                level[f]--;
                level[f - s]++;
            } else {
                bins++;
                level[n - s]++;
            }
        }
    }
    return bins;
}
