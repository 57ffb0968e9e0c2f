/*
 * The C ABI test: a real C program compiled against include/strata.h and libstrata.
 *
 *   test_strata            local transport: strataCommInitLocal(8, "nodes:2x4") driven by
 *                          8 pthreads (every collective, f32/f16/bf16/i32, in-place forms,
 *                          groups, coalesced, split, send/recv), every error path, the
 *                          unique-id + strataCommInitRank path from threads, one
 *                          thread driving a whole world inside a group, the 256-byte
 *                          unique id and the GPU transports' constants (not compiled
 *                          into this build: strataInvalidUsage naming the feature).
 *   test_strata --mpi      under mpirun: one rank per process on the mpi transport (library
 *                          built with --features mpi). Built with mpicc and
 *                          -DSTRATA_TEST_WITH_MPI, the program initialises MPI itself and
 *                          broadcasts the unique id from rank 0 (the NCCL pattern); built
 *                          with plain cc, strata initialises MPI, ranks come from
 *                          OMPI_COMM_WORLD_RANK/SIZE, and strataFinalize ends it.
 *
 * Prints "<mode>: N passed, 0 failed" and exits 0, or names the first failed check and
 * exits 1.
 */
#define _POSIX_C_SOURCE 200809L
#include "strata.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef STRATA_TEST_WITH_MPI
#include <mpi.h>
#endif

static atomic_long passed;
#define CHECK_PASSED() atomic_fetch_add(&passed, 1)
#include "check.h"

/* A call that must fail with `code` and leave a message on `comm` (NULL: the thread). */
#define EXPECT(code, comm, call)                                                   \
  do {                                                                             \
    strataResult_t r_ = (call);                                                    \
    const char *m_ = strataGetLastError(comm);                                     \
    if (r_ != (code)) FAIL("%s -> %d, expected %d (%s)", #call, r_, code, m_);     \
    if (m_ == NULL || m_[0] == '\0') FAIL("%s: empty strataGetLastError", #call);  \
    atomic_fetch_add(&passed, 1);                                                  \
  } while (0)

/* ---- f16 / bf16 bits by hand (exact for the small integers used here) ---- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t to_bf16(float f) { /* round to nearest even */
  uint32_t u = f32_bits(f);
  return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) { return bits_f32((uint32_t)h << 16); }
static uint16_t to_f16(float f) { /* normal numbers and zero; round to nearest even */
  uint32_t u = f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000;
  int32_t e = (int32_t)((u >> 23) & 0xff) - 127 + 15;
  uint32_t m = u & 0x7fffff;
  if ((u & 0x7fffffff) == 0) return (uint16_t)sign;
  if (e <= 0 || e >= 31) FAIL("to_f16: %g outside the normal f16 range", f);
  uint32_t h = sign | ((uint32_t)e << 10) | (m >> 13);
  uint32_t rest = m & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
  return (uint16_t)h;
}
static float from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0 && m == 0) return bits_f32(sign);
  if (e == 0 || e == 31) FAIL("from_f16: subnormal/inf/nan %#x", h);
  return bits_f32(sign | ((e - 15 + 127) << 23) | (m << 13));
}

/* ---- the per-rank body: every function's results ---- */

/* Input value of element i of rank r (small integers: exact sums in every dtype). */
static float val(int r, size_t i) { return (float)((int)((r * 7 + (int)i * 3) % 11) - 5); }

static void test_all_gather(strataComm_t c, int r, int n) {
  enum { C = 5 };
  float send[C], *recv = malloc(sizeof(float) * C * n);
  for (size_t i = 0; i < C; i++) send[i] = val(r, i);
  OK(strataAllGather(send, recv, C, strataFloat32, c, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < C; i++)
      CHECK(recv[p * C + i] == val(p, i), "all-gather rank %d block %d[%zu] = %g", r, p, i,
            recv[p * C + i]);
  /* In place: sendbuff == recvbuff + rank * count. */
  memset(recv, 0, sizeof(float) * C * n);
  for (size_t i = 0; i < C; i++) recv[r * C + i] = val(r, i);
  OK(strataAllGather(recv + r * C, recv, C, strataFloat32, c, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < C; i++)
      CHECK(recv[p * C + i] == val(p, i), "in-place all-gather rank %d block %d", r, p);
  /* bf16 */
  uint16_t s16[C], *r16 = malloc(2 * C * n);
  for (size_t i = 0; i < C; i++) s16[i] = to_bf16(val(r, i));
  OK(strataAllGather(s16, r16, C, strataBfloat16, c, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < C; i++)
      CHECK(from_bf16(r16[p * C + i]) == val(p, i), "bf16 all-gather rank %d", r);
  free(r16);
  free(recv);
}

static float reduce_ref(int op, int n, size_t i) {
  float acc = val(0, i);
  for (int p = 1; p < n; p++) {
    float v = val(p, i);
    switch (op) {
      case strataSum: case strataAvg: acc += v; break;
      case strataProd: acc *= v; break;
      case strataMax: acc = v > acc ? v : acc; break;
      case strataMin: acc = v < acc ? v : acc; break;
    }
  }
  return op == strataAvg ? acc / (float)n : acc;
}

static int close_to(float a, float b) {
  float d = a - b;
  return d <= 1e-5f && d >= -1e-5f;
}

static void test_reduce_scatter(strataComm_t c, int r, int n) {
  enum { C = 3 };
  float *send = malloc(sizeof(float) * C * n), recv[C];
  const int ops[] = {strataSum, strataAvg, strataMax, strataMin};
  for (int k = 0; k < 4; k++) {
    /* Block p of every rank's send holds the inputs for rank p: element i = val(rank, p*C+i). */
    for (size_t i = 0; i < (size_t)C * n; i++) send[i] = val(r, i);
    OK(strataReduceScatter(send, recv, C, strataFloat32, ops[k], c, NULL));
    for (size_t i = 0; i < C; i++)
      CHECK(close_to(recv[i], reduce_ref(ops[k], n, r * C + i)),
            "reduce-scatter op %d rank %d [%zu] = %g, want %g", ops[k], r, i, recv[i],
            reduce_ref(ops[k], n, r * C + i));
    /* In place: recvbuff == sendbuff + rank * recvcount. */
    OK(strataReduceScatter(send, send + r * C, C, strataFloat32, ops[k], c, NULL));
    for (size_t i = 0; i < C; i++)
      CHECK(close_to(send[r * C + i], reduce_ref(ops[k], n, r * C + i)),
            "in-place reduce-scatter op %d rank %d", ops[k], r);
    /* The rest of sendbuff is untouched. */
    for (size_t i = 0; i < (size_t)C * n; i++)
      if (i / C != (size_t)r) CHECK(send[i] == val(r, i), "in-place reduce-scatter wrote outside recvbuff");
  }
  /* f16 avg */
  uint16_t *s16 = malloc(2 * C * n), r16[C];
  for (size_t i = 0; i < (size_t)C * n; i++) s16[i] = to_f16(val(r, i));
  OK(strataReduceScatter(s16, r16, C, strataFloat16, strataAvg, c, NULL));
  for (size_t i = 0; i < C; i++) {
    float want = from_f16(to_f16(reduce_ref(strataSum, n, r * C + i) / (float)n));
    float got = from_f16(r16[i]);
    CHECK(got - want < 2e-3f && want - got < 2e-3f, "f16 avg reduce-scatter %g vs %g", got, want);
  }
  free(s16);
  free(send);
}

static void test_all_reduce(strataComm_t c, int r, int n) {
  enum { C = 4 };
  float send[C], recv[C];
  const int ops[] = {strataSum, strataAvg, strataMax, strataMin};
  for (int k = 0; k < 4; k++) {
    for (size_t i = 0; i < C; i++) send[i] = val(r, i);
    OK(strataAllReduce(send, recv, C, strataFloat32, ops[k], c, NULL));
    for (size_t i = 0; i < C; i++)
      CHECK(close_to(recv[i], reduce_ref(ops[k], n, i)), "all-reduce op %d rank %d", ops[k], r);
    OK(strataAllReduce(send, send, C, strataFloat32, ops[k], c, NULL)); /* in place */
    for (size_t i = 0; i < C; i++)
      CHECK(close_to(send[i], reduce_ref(ops[k], n, i)), "in-place all-reduce op %d", ops[k]);
  }
  /* bf16 sum, f16 sum, i32 max */
  uint16_t b[C], h[C];
  int32_t s32[C], r32[C];
  for (size_t i = 0; i < C; i++) {
    b[i] = to_bf16(val(r, i));
    h[i] = to_f16(val(r, i));
    s32[i] = (int32_t)val(r, i) * 1000 + r;
  }
  OK(strataAllReduce(b, b, C, strataBfloat16, strataSum, c, NULL));
  OK(strataAllReduce(h, h, C, strataHalf, strataSum, c, NULL));
  OK(strataAllReduce(s32, r32, C, strataInt32, strataMax, c, NULL));
  for (size_t i = 0; i < C; i++) {
    CHECK(from_bf16(b[i]) == reduce_ref(strataSum, n, i), "bf16 all-reduce");
    CHECK(from_f16(h[i]) == reduce_ref(strataSum, n, i), "f16 all-reduce");
    int32_t want = INT32_MIN;
    for (int p = 0; p < n; p++) {
      int32_t v = (int32_t)val(p, i) * 1000 + p;
      if (v > want) want = v;
    }
    CHECK(r32[i] == want, "i32 max all-reduce %d vs %d", r32[i], want);
  }
  /* i64 sum and avg past 2^53 (exact, no trip through double), f64 sum */
  int64_t s64[C], a64[C];
  double d64[C];
  const int64_t big = (int64_t)1 << 58;
  for (size_t i = 0; i < C; i++) {
    s64[i] = a64[i] = big + (int64_t)val(r, i);
    d64[i] = (double)val(r, i) / 4;
  }
  OK(strataAllReduce(s64, s64, C, strataInt64, strataSum, c, NULL));
  OK(strataAllReduce(a64, a64, C, strataInt64, strataAvg, c, NULL));
  OK(strataAllReduce(d64, d64, C, strataFloat64, strataSum, c, NULL));
  for (size_t i = 0; i < C; i++) {
    int64_t sum = 0;
    for (int p = 0; p < n; p++) sum += big + (int64_t)val(p, i);
    int64_t q = sum / n, rem = sum % n; /* sum > 0: round half up */
    int64_t avg = 2 * rem >= n ? q + 1 : q;
    CHECK(s64[i] == sum, "i64 sum all-reduce %lld vs %lld", (long long)s64[i], (long long)sum);
    CHECK(a64[i] == avg, "i64 avg all-reduce %lld vs %lld", (long long)a64[i], (long long)avg);
    CHECK(d64[i] == (double)reduce_ref(strataSum, n, i) / 4, "f64 sum all-reduce");
  }
}

static void test_all_to_all(strataComm_t c, int r, int n) {
  enum { C = 2 };
  float *send = malloc(sizeof(float) * C * n), *recv = malloc(sizeof(float) * C * n);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < C; i++) send[p * C + i] = (float)(r * 100 + p * 10 + (int)i);
  OK(strataAllToAll(send, recv, C, strataFloat32, c, NULL));
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < C; i++)
      CHECK(recv[p * C + i] == (float)(p * 100 + r * 10 + (int)i), "all-to-all rank %d from %d", r, p);
  free(send);
  free(recv);
}

static void test_broadcast(strataComm_t c, int r, int n) {
  enum { C = 6 };
  int root = n > 1 ? n - 2 : 0;
  float send[C], recv[C];
  for (size_t i = 0; i < C; i++) {
    send[i] = r == root ? val(root, i) : -99.0f;
    recv[i] = -1.0f;
  }
  /* Non-roots pass NULL sendbuff: it is read on the root only. */
  OK(strataBroadcast(r == root ? send : NULL, recv, C, strataFloat32, root, c, NULL));
  for (size_t i = 0; i < C; i++) CHECK(recv[i] == val(root, i), "broadcast rank %d", r);
  for (size_t i = 0; i < C; i++) recv[i] = r == 0 ? val(7, i) : 0.0f;
  OK(strataBroadcast(recv, recv, C, strataFloat32, 0, c, NULL)); /* in place */
  for (size_t i = 0; i < C; i++) CHECK(recv[i] == val(7, i), "in-place broadcast rank %d", r);
  uint16_t h[C];
  for (size_t i = 0; i < C; i++) h[i] = r == 0 ? to_f16(val(3, i)) : 0;
  OK(strataBcast(h, C, strataFloat16, 0, c, NULL));
  for (size_t i = 0; i < C; i++) CHECK(from_f16(h[i]) == val(3, i), "f16 bcast rank %d", r);
}

static void test_send_recv_group(strataComm_t c, int r, int n) {
  enum { C = 3 };
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  float send[C], recv[C], ag_recv[64 * 1];
  for (size_t i = 0; i < C; i++) send[i] = val(r, i);
  /* A ring exchange: receive first, then send, in one group. */
  OK(strataGroupStart());
  OK(strataRecv(recv, C, strataFloat32, prev, c, NULL));
  OK(strataSend(send, C, strataFloat32, next, c, NULL));
  OK(strataGroupEnd());
  for (size_t i = 0; i < C; i++) CHECK(recv[i] == val(prev, i), "ring recv rank %d", r);
  /* Blocking send then receive (host sends are eager). */
  if (n > 1) {
    memset(recv, 0, sizeof recv);
    OK(strataSend(send, C, strataFloat32, next, c, NULL));
    OK(strataRecv(recv, C, strataFloat32, prev, c, NULL));
    for (size_t i = 0; i < C; i++) CHECK(recv[i] == val(prev, i), "blocking recv rank %d", r);
  }
  /* A group of different collectives, nested; results appear at the outer end. */
  float ar[2] = {(float)r, 1.0f};
  float one = (float)r;
  OK(strataGroupStart());
  OK(strataGroupStart());
  OK(strataAllReduce(ar, ar, 2, strataFloat32, strataSum, c, NULL));
  OK(strataGroupEnd());
  OK(strataAllGather(&one, ag_recv, 1, strataFloat32, c, NULL));
  OK(strataGroupEnd());
  CHECK(ar[0] == (float)(n * (n - 1) / 2) && ar[1] == (float)n, "grouped all-reduce rank %d", r);
  for (int p = 0; p < n; p++) CHECK(ag_recv[p] == (float)p, "grouped all-gather rank %d", r);
}

static void test_coalesced(strataComm_t c, int r, int n) {
  /* Three buffers of uneven counts; the second in place. */
  size_t counts[3] = {1, 7, 4};
  float *sends[3], *recvs[3];
  for (int b = 0; b < 3; b++) {
    recvs[b] = calloc(counts[b] * n, sizeof(float));
    sends[b] = malloc(sizeof(float) * counts[b]);
    for (size_t i = 0; i < counts[b]; i++) sends[b][i] = val(r, i + 10 * b);
  }
  float *in_place = recvs[1] + r * counts[1];
  memcpy(in_place, sends[1], sizeof(float) * counts[1]);
  const void *sp[3] = {sends[0], in_place, sends[2]};
  void *rp[3] = {recvs[0], recvs[1], recvs[2]};
  OK(strataAllGatherCoalesced(sp, rp, counts, 3, strataFloat32, c, NULL));
  for (int b = 0; b < 3; b++)
    for (int p = 0; p < n; p++)
      for (size_t i = 0; i < counts[b]; i++)
        CHECK(recvs[b][p * counts[b] + i] == val(p, i + 10 * b), "coalesced all-gather buf %d rank %d", b, r);
  /* Reduce-scatter: send b holds n * counts[b]; buffer 0 in place. */
  float *rs_send[3], rs_recv1[7], rs_recv2[4];
  for (int b = 0; b < 3; b++) {
    rs_send[b] = malloc(sizeof(float) * counts[b] * n);
    for (size_t i = 0; i < counts[b] * n; i++) rs_send[b][i] = val(r, i + 10 * b);
  }
  const void *rsp[3] = {rs_send[0], rs_send[1], rs_send[2]};
  void *rrp[3] = {rs_send[0] + r * counts[0], rs_recv1, rs_recv2};
  OK(strataReduceScatterCoalesced(rsp, rrp, counts, 3, strataFloat32, strataSum, c, NULL));
  for (int b = 0; b < 3; b++)
    for (size_t i = 0; i < counts[b]; i++) {
      float got = ((float *)rrp[b])[i];
      CHECK(got == reduce_ref(strataSum, n, r * counts[b] + i + 10 * b), "coalesced reduce-scatter buf %d rank %d", b, r);
    }
  /* bf16 avg coalesced */
  uint16_t hs[2 * 64], hr[2];
  size_t hc[1] = {2};
  for (int i = 0; i < 2 * n; i++) hs[i] = to_bf16((float)(r + i));
  const void *hsp[1] = {hs};
  void *hrp[1] = {hr};
  OK(strataReduceScatterCoalesced(hsp, hrp, hc, 1, strataBfloat16, strataAvg, c, NULL));
  for (int i = 0; i < 2; i++) {
    float want = (float)(n - 1) / 2.0f + (float)(2 * r + i);
    CHECK(from_bf16(hr[i]) == from_bf16(to_bf16(want)), "bf16 avg coalesced %g vs %g", from_bf16(hr[i]), want);
  }
  for (int b = 0; b < 3; b++) {
    free(sends[b]);
    free(recvs[b]);
    free(rs_send[b]);
  }
}

static void test_split(strataComm_t c, int r, int n) {
  /* Even and odd ranks, reversed by key. */
  strataComm_t sub = NULL;
  OK(strataCommSplit(c, r % 2, -r, &sub, NULL));
  int sn = 0, sr = -1;
  OK(strataCommCount(sub, &sn));
  OK(strataCommUserRank(sub, &sr));
  int members = (n - r % 2 + 1) / 2;
  CHECK(sn == members, "split count %d vs %d", sn, members);
  CHECK(sr == members - 1 - r / 2, "split rank %d (world %d)", sr, r);
  float x = (float)r, sum = 0;
  OK(strataAllReduce(&x, &sum, 1, strataFloat32, strataSum, sub, NULL));
  float want = 0;
  for (int p = r % 2; p < n; p += 2) want += (float)p;
  CHECK(sum == want, "split all-reduce %g vs %g", sum, want);
  OK(strataCommDestroy(sub));
  /* Use after destroy is detected. */
  EXPECT(strataInvalidUsage, sub, strataAllReduce(&x, &sum, 1, strataFloat32, strataSum, sub, NULL));
  EXPECT(strataInvalidUsage, sub, strataCommCount(sub, &sn));
  EXPECT(strataInvalidUsage, NULL, strataCommDestroy(sub));
  /* NOCOLOR: rank 0 opts out. */
  strataComm_t sub2 = (strataComm_t)&sub; /* must be overwritten with NULL */
  OK(strataCommSplit(c, r == 0 ? STRATA_SPLIT_NOCOLOR : 1, 0, &sub2, NULL));
  if (r == 0) {
    CHECK(sub2 == NULL, "NOCOLOR split gave a communicator");
  } else {
    OK(strataCommCount(sub2, &sn));
    CHECK(sn == n - 1, "split without rank 0 has %d ranks", sn);
    OK(strataCommUserRank(sub2, &sr));
    CHECK(sr == r - 1, "split rank %d", sr);
    OK(strataCommDestroy(sub2));
  }
}

/* Every error path that does not communicate (so every rank may run it). */
static void test_errors(strataComm_t c, int r, int n) {
  float buf[16] = {0}, out[16 * 64];
  int x;
  (void)r;
  /* NULL communicator. */
  EXPECT(strataInvalidArgument, NULL, strataAllReduce(buf, out, 1, strataFloat32, strataSum, NULL, NULL));
  EXPECT(strataInvalidArgument, NULL, strataAllGather(buf, out, 1, strataFloat32, NULL, NULL));
  EXPECT(strataInvalidArgument, NULL, strataCommCount(NULL, &x));
  EXPECT(strataInvalidArgument, NULL, strataCommSplit(NULL, 0, 0, NULL, NULL));
  /* Not a communicator at all (never dereferenced). */
  EXPECT(strataInvalidArgument, NULL, strataCommUserRank((strataComm_t)(uintptr_t)0x1234, &x));
  /* NULL buffers with a nonzero count; NULL with count 0 is fine. */
  EXPECT(strataInvalidArgument, c, strataAllReduce(NULL, out, 4, strataFloat32, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, NULL, 4, strataFloat32, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllGather(NULL, out, 4, strataFloat32, c, NULL));
  EXPECT(strataInvalidArgument, c, strataReduceScatter(buf, NULL, 1, strataFloat32, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllToAll(NULL, out, 1, strataFloat32, c, NULL));
  EXPECT(strataInvalidArgument, c, strataSend(NULL, 1, strataFloat32, 0, c, NULL));
  EXPECT(strataInvalidArgument, c, strataRecv(NULL, 1, strataFloat32, 0, c, NULL));
  EXPECT(strataInvalidArgument, c, strataBroadcast(buf, NULL, 1, strataFloat32, 0, c, NULL));
  OK(strataAllReduce(NULL, NULL, 0, strataFloat32, strataSum, c, NULL));
  OK(strataAllGather(NULL, NULL, 0, strataFloat32, c, NULL));
  EXPECT(strataInvalidArgument, NULL, strataCommCount(c, NULL));
  EXPECT(strataInvalidArgument, NULL, strataCommUserRank(c, NULL));
  EXPECT(strataInvalidArgument, NULL, strataGetVersion(NULL));
  EXPECT(strataInvalidArgument, NULL, strataGetUniqueId(NULL));
  /* count x dtype (x nranks) overflow. */
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, out, SIZE_MAX / 2, strataFloat32, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllGather(buf, out, SIZE_MAX / 4 / (size_t)n + 1, strataFloat32, c, NULL));
  EXPECT(strataInvalidArgument, c, strataReduceScatter(buf, out, SIZE_MAX / 3, strataInt8, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllToAll(buf, out, SIZE_MAX / 2, strataBfloat16, c, NULL));
  const void *sp[1] = {buf};
  void *rp[1] = {out};
  size_t huge[1] = {SIZE_MAX / 2};
  EXPECT(strataInvalidArgument, c, strataAllGatherCoalesced(sp, rp, huge, 1, strataFloat32, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllGatherCoalesced(NULL, rp, huge, 1, strataFloat32, c, NULL));
  /* Unknown dtype and op (NCCL's fp8 e4m3 and e5m2, and garbage). */
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, out, 1, 10, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, out, 1, 11, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllGather(buf, out, 1, 42, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllGather(buf, out, 1, -1, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, out, 1, strataFloat32, 5, c, NULL));
  EXPECT(strataInvalidArgument, c, strataReduceScatter(buf, out, 1, strataFloat32, -1, c, NULL));
  /* Rank (root, peer) out of range. */
  EXPECT(strataInvalidArgument, c, strataBroadcast(buf, out, 1, strataFloat32, n, c, NULL));
  EXPECT(strataInvalidArgument, c, strataBroadcast(buf, out, 1, strataFloat32, -1, c, NULL));
  EXPECT(strataInvalidArgument, c, strataSend(buf, 1, strataFloat32, n, c, NULL));
  EXPECT(strataInvalidArgument, c, strataRecv(out, 1, strataFloat32, -2, c, NULL));
  strataComm_t bad;
  EXPECT(strataInvalidArgument, NULL, strataCommSplit(c, -5, 0, &bad, NULL));
  /* Buffers that alias outside NCCL's in-place layouts. */
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, buf + 1, 4, strataFloat32, strataSum, c, NULL));
  EXPECT(strataInvalidArgument, c, strataAllToAll(out, out, 1, strataFloat32, c, NULL));
  if (n > 1) {
    int wrong = (r + 1) % n; /* sendbuff inside recvbuff at another rank's block */
    EXPECT(strataInvalidArgument, c, strataAllGather(out + wrong * 2, out, 2, strataFloat32, c, NULL));
    EXPECT(strataInvalidArgument, c, strataReduceScatter(out, out + wrong * 2, 2, strataFloat32, strataSum, c, NULL));
  }
  void *rp2[2] = {out, out + 1}; /* two receive buffers overlapping */
  const void *sp2[2] = {buf, buf + 4};
  size_t c2[2] = {2, 2};
  EXPECT(strataInvalidArgument, c, strataAllGatherCoalesced(sp2, rp2, c2, 2, strataFloat32, c, NULL));
  /* The messages name the function. */
  EXPECT(strataInvalidArgument, c, strataAllReduce(buf, out, 1, 10, strataSum, c, NULL));
  CHECK(strstr(strataGetLastError(c), "strataAllReduce") != NULL, "message names the function: %s", strataGetLastError(c));
  CHECK(strstr(strataGetLastError(NULL), "datatype 10") != NULL, "thread message: %s", strataGetLastError(NULL));
  /* Group end without start. */
  EXPECT(strataInvalidUsage, NULL, strataGroupEnd());
  /* Configs. */
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  strataComm_t cs[2];
  cfg.magic = 0;
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  cfg = (strataConfig_t)STRATA_CONFIG_INITIALIZER;
  cfg.size = 8;
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  cfg = (strataConfig_t)STRATA_CONFIG_INITIALIZER;
  cfg.algo = "bogus";
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  cfg = (strataConfig_t)STRATA_CONFIG_INITIALIZER;
  cfg.transport = 9;
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  cfg = (strataConfig_t)STRATA_CONFIG_INITIALIZER;
  cfg.timeout_ms = -1;
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  EXPECT(strataInvalidArgument, NULL, strataCommSplit(c, 0, 0, &bad, &cfg));
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, "nodes:0x4", NULL));
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 0, NULL, NULL));
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(NULL, 2, NULL, NULL));
  EXPECT(strataInvalidUsage, NULL, strataCommInitLocal(cs, 3, "nodes:2x2", NULL)); /* size mismatch */
  /* Init-rank argument checks (fail before any rendezvous). */
  strataUniqueId id, zero;
  memset(&zero, 0, sizeof zero);
  OK(strataGetUniqueId(&id));
  EXPECT(strataInvalidArgument, NULL, strataCommInitRank(&bad, 4, id, 4));
  EXPECT(strataInvalidArgument, NULL, strataCommInitRank(&bad, 4, id, -1));
  EXPECT(strataInvalidArgument, NULL, strataCommInitRank(&bad, 0, id, 0));
  EXPECT(strataInvalidArgument, NULL, strataCommInitRank(NULL, 1, id, 0));
  EXPECT(strataInvalidArgument, NULL, strataCommInitRank(&bad, 1, zero, 0));
  /* Error strings. */
  CHECK(strcmp(strataGetErrorString(strataSuccess), "no error") == 0, "success string");
  for (int k = 1; k < strataNumResults; k++)
    CHECK(strlen(strataGetErrorString(k)) > 0, "error string %d", k);
  CHECK(strcmp(strataGetErrorString(99), "unknown result code") == 0, "unknown code string");
  /* After all that the communicator still works. */
  float one = 1.0f, total = 0.0f;
  OK(strataAllReduce(&one, &total, 1, strataFloat32, strataSum, c, NULL));
  CHECK(total == (float)n, "communicator works after errors");
}

/* Host streams: nonblocking calls on several communicators, ordered per stream and by
 * events, a query before completion, and the handle errors. */
static void test_host_streams(strataComm_t c, int r, int n) {
  strataComm_t d = NULL;
  OK(strataCommSplit(c, 0, r, &d, NULL)); /* the same ranks: a second communicator */
  strataStream_t s1 = NULL, s2 = NULL;
  strataEvent_t ev = NULL;
  OK(strataStreamCreate(&s1));
  OK(strataStreamCreate(&s2));
  OK(strataEventCreate(&ev));
  OK(strataEventQuery(ev)); /* never recorded: complete */

  /* On s1: an all-reduce on c, then an all-gather on d of its result (the stream orders
   * them across communicators); on s2, after the event, an all-reduce on d of that. */
  enum { K = 1000 };
  float x[K], z[K];
  float *y = malloc(sizeof(float) * K * (size_t)n);
  if (!y) FAIL("malloc");
  for (int i = 0; i < K; i++) x[i] = (float)(r + 1);
  OK(strataAllReduce(x, x, K, strataFloat32, strataSum, c, s1));
  OK(strataAllGather(x, y, K, strataFloat32, d, s1));
  OK(strataEventRecord(ev, s1));
  OK(strataStreamWaitEvent(s2, ev));
  for (int i = 0; i < K; i++) z[i] = 0.0f;
  OK(strataAllReduce(y, z, K, strataFloat32, strataMax, d, s2));
  OK(strataStreamSynchronize(s2));
  OK(strataEventSynchronize(ev));
  OK(strataStreamQuery(s1));
  float sum = (float)n * (float)(n + 1) / 2.0f;
  int good = 1;
  for (int i = 0; i < K * n; i++) good &= y[i] == sum;
  for (int i = 0; i < K; i++) good &= x[i] == sum && z[i] == sum;
  CHECK(good, "stream-ordered calls across communicators: wrong results");
  free(y);

  /* A call that cannot complete yet says so: rank 0 receives on d from rank 1, which
   * sends only after a blocking all-reduce on c that rank 0 joins after its query. */
  if (n >= 2) {
    float got[3] = {0, 0, 0}, flag = 1.0f, all = 0.0f;
    if (r == 0) {
      OK(strataRecv(got, 3, strataFloat32, 1, d, s1));
      EXPECT(strataInProgress, NULL, strataStreamQuery(s1));
      OK(strataEventRecord(ev, s1));
      EXPECT(strataInProgress, NULL, strataEventQuery(ev));
    }
    OK(strataAllReduce(&flag, &all, 1, strataFloat32, strataSum, c, NULL));
    if (r == 1) {
      float v[3] = {1.5f, 2.5f, 3.5f};
      OK(strataSend(v, 3, strataFloat32, 0, d, NULL));
    }
    if (r == 0) {
      OK(strataEventSynchronize(ev));
      OK(strataStreamSynchronize(s1));
      CHECK(got[0] == 1.5f && got[1] == 2.5f && got[2] == 3.5f, "received on a stream");
    }
  }

  /* A nonblocking call that fails while running: its error comes from the stream's
   * synchronize and from strataCommGetAsyncError (counts differ across ranks). */
  strataResult_t async_err = -1;
  OK(strataCommGetAsyncError(d, &async_err));
  CHECK(async_err == strataSuccess, "no async error yet: %d", async_err);
  strataTransport_t tr = -1;
  OK(strataCommGetTransport(d, &tr));
  /* local only: on mpi a rank that never sees the bad length learns of the failure only
   * by its timeout (MPI peers are not told), which the next world creation waits out */
  if (n >= 2 && tr == strataTransportLocal) {
    size_t cnt = r == 0 ? 4 : 8;
    float *in = calloc(cnt, sizeof(float)), *out = calloc(cnt * (size_t)n, sizeof(float));
    if (!in || !out) FAIL("calloc");
    OK(strataAllGather(in, out, cnt, strataFloat32, d, s1));
    strataResult_t sr = strataStreamSynchronize(s1);
    CHECK(sr == strataInvalidUsage || sr == strataRemoteError, "mismatched call on a stream -> %d", sr);
    OK(strataCommGetAsyncError(d, &async_err));
    CHECK(async_err == strataInvalidUsage || async_err == strataRemoteError, "async error %d", async_err);
    CHECK(strlen(strataGetLastError(d)) > 0, "the async error is explained");
    free(in);
    free(out);
  }
  EXPECT(strataInvalidArgument, NULL, strataCommGetAsyncError(NULL, &async_err));

  /* Bad handles: errors, never crashes. */
  strataStream_t gone = s2;
  OK(strataStreamDestroy(s2));
  EXPECT(strataInvalidUsage, NULL, strataStreamSynchronize(gone));
  EXPECT(strataInvalidUsage, NULL, strataStreamQuery(gone));
  EXPECT(strataInvalidArgument, NULL, strataStreamSynchronize(NULL));
  EXPECT(strataInvalidArgument, NULL, strataStreamCreate(NULL));
  EXPECT(strataInvalidArgument, NULL, strataEventRecord(ev, (strataStream_t)(uintptr_t)0x1234));
  EXPECT(strataInvalidUsage, c, strataAllReduce(x, x, K, strataFloat32, strataSum, c, gone));
  OK(strataEventDestroy(ev));
  EXPECT(strataInvalidUsage, NULL, strataEventQuery(ev));
  OK(strataStreamDestroy(s1));
  strataCommDestroy(d); /* failed above: destroy only releases it */
}

static void rank_body(strataComm_t c) {
  int r = -1, n = 0;
  OK(strataCommUserRank(c, &r));
  OK(strataCommCount(c, &n));
  test_errors(c, r, n);
  test_all_gather(c, r, n);
  test_reduce_scatter(c, r, n);
  test_all_reduce(c, r, n);
  test_all_to_all(c, r, n);
  test_broadcast(c, r, n);
  test_send_recv_group(c, r, n);
  test_coalesced(c, r, n);
  test_split(c, r, n);
  test_host_streams(c, r, n);
}

/* ---- host-local: the CPU device, memory from strataMemAlloc ---- */

static void *host_local_rank(void *arg) {
  strataComm_t c = (strataComm_t)arg;
  int r = -1, n = 0;
  OK(strataCommUserRank(c, &r));
  OK(strataCommCount(c, &n));
  float *send = NULL, *recv = NULL, *sum = NULL;
  OK(strataMemAlloc(c, 3 * sizeof(float), (void **)&send));
  OK(strataMemAlloc(c, 3 * (size_t)n * sizeof(float), (void **)&recv));
  OK(strataMemAlloc(c, 3 * sizeof(float), (void **)&sum));
  /* CPU-device memory is host memory: written directly while no call uses it. */
  for (int k = 0; k < 3; k++) send[k] = (float)(r * 3 + k);
  OK(strataAllGather(send, recv, 3, strataFloat32, c, NULL));
  for (int k = 0; k < 3 * n; k++) CHECK(recv[k] == (float)k, "host-local all-gather [%d] = %g", k, recv[k]);
  /* Nonblocking on a strata host stream, completion observed by synchronize. */
  strataStream_t s = NULL;
  OK(strataStreamCreate(&s));
  OK(strataAllReduce(send, sum, 3, strataFloat32, strataSum, c, s));
  OK(strataAllGather(sum, recv, 3, strataFloat32, c, s));
  OK(strataStreamSynchronize(s));
  for (int k = 0; k < 3; k++) {
    float want = 0;
    for (int j = 0; j < n; j++) want += (float)(j * 3 + k);
    CHECK(sum[k] == want, "host-local all-reduce [%d] = %g, want %g", k, sum[k], want);
    CHECK(recv[3 * (n - 1) + k] == want, "host-local stream order [%d]", k);
  }
  OK(strataStreamDestroy(s));
  /* Host memory is not the communicator's device memory. */
  float host[3] = {0, 0, 0};
  EXPECT(strataInvalidArgument, c, strataAllReduce(host, host, 3, strataFloat32, strataSum, c, NULL));
  OK(strataMemFree(c, send));
  OK(strataMemFree(c, recv));
  OK(strataMemFree(c, sum));
  EXPECT(strataInvalidArgument, NULL, strataMemFree(c, send));
  return NULL;
}

static void test_host_local(void) {
  enum { N = 4 };
  strataComm_t comms[N];
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportHostLocal;
  cfg.timeout_ms = 20000;
  OK(strataCommInitLocal(comms, N, "nodes:2x2", &cfg));
  strataTransport_t tr = -1;
  OK(strataCommGetTransport(comms[0], &tr));
  CHECK(tr == strataTransportHostLocal, "host-local world's transport %d", tr);
  pthread_t t[N];
  for (int i = 0; i < N; i++)
    if (pthread_create(&t[i], NULL, host_local_rank, comms[i])) FAIL("pthread_create");
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) OK(strataCommDestroy(comms[i]));
}

/* ---- local mode ---- */

static void *rank_thread(void *arg) {
  rank_body((strataComm_t)arg);
  return NULL;
}

struct init_arg {
  strataUniqueId id;
  int nranks, rank, timeout_ms, expect;
  const char *topology;
};

/* One rank of a world made with strataGetUniqueId + strataCommInitRankConfig. */
static void *init_rank_thread(void *p) {
  struct init_arg *a = p;
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportLocal;
  cfg.topology = a->topology;
  cfg.algo = "hier";
  cfg.timeout_ms = a->timeout_ms;
  strataComm_t c = NULL;
  strataResult_t res = strataCommInitRankConfig(&c, a->nranks, a->id, a->rank, &cfg);
  if (a->expect != strataSuccess) {
    CHECK(res == a->expect, "init rank %d -> %d, expected %d (%s)", a->rank, res, a->expect, strataGetLastError(NULL));
    CHECK(strlen(strataGetLastError(NULL)) > 0, "init failure message");
    return NULL;
  }
  if (res != strataSuccess) FAIL("init rank %d -> %d: %s", a->rank, res, strataGetLastError(NULL));
  int r, n;
  OK(strataCommUserRank(c, &r));
  OK(strataCommCount(c, &n));
  CHECK(r == a->rank && n == a->nranks, "init-rank world %d/%d", r, n);
  float x[2] = {(float)r, 2.0f}, y[2];
  OK(strataAllReduce(x, y, 2, strataFloat32, strataSum, c, NULL));
  CHECK(y[0] == (float)(n * (n - 1) / 2) && y[1] == 2.0f * (float)n, "init-rank all-reduce");
  float *g = malloc(sizeof(float) * 2 * n);
  OK(strataAllGather(x, g, 2, strataFloat32, c, NULL));
  for (int p = 0; p < n; p++) CHECK(g[2 * p] == (float)p, "init-rank all-gather");
  free(g);
  OK(strataCommDestroy(c));
  return NULL;
}

static void run_init_world(int nranks, const char *topo, int timeout_ms, const int *expect, int nthreads) {
  strataUniqueId id;
  OK(strataGetUniqueId(&id));
  pthread_t t[16];
  struct init_arg a[16];
  for (int i = 0; i < nthreads; i++) {
    a[i] = (struct init_arg){id, nranks, i, timeout_ms, expect ? expect[i] : strataSuccess, topo};
    if (pthread_create(&t[i], NULL, init_rank_thread, &a[i])) FAIL("pthread_create");
  }
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
}

struct mismatch_arg {
  strataUniqueId id;
  int nranks, rank;
  strataResult_t got;
};

static void *mismatch_thread(void *p) {
  struct mismatch_arg *a = p;
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.timeout_ms = 300;
  strataComm_t c = NULL;
  a->got = strataCommInitRankConfig(&c, a->nranks, a->id, a->rank, &cfg);
  if (a->got == strataSuccess) strataCommDestroy(c);
  return NULL;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

struct blocked_arg {
  strataComm_t comm;
  strataResult_t got;
  char message[512];
};

/* Rank 0 of a 2-rank world all-reduces alone: blocked until someone aborts it. */
static void *blocked_thread(void *p) {
  struct blocked_arg *a = p;
  float x = 1.0f, y = 0.0f;
  a->got = strataAllReduce(&x, &y, 1, strataFloat32, strataSum, a->comm, NULL);
  snprintf(a->message, sizeof a->message, "%s", strataGetLastError(NULL));
  return NULL;
}

/* ---- unique ids (256 bytes, vendor id at STRATA_UNIQUE_ID_VENDOR_OFFSET) and the GPU
   transports' constants; in a build without `cuda` / `rocm` they are strataInvalidUsage
   naming the cargo feature. Runs before any thread (it sets STRATA_TRANSPORT). ---- */

_Static_assert(sizeof(strataUniqueId) == 256, "strataUniqueId is 256 bytes");
_Static_assert(STRATA_UNIQUE_ID_BYTES == 256 && STRATA_UNIQUE_ID_VENDOR_OFFSET == 128, "id layout");
_Static_assert(strataTransportNccl == 3 && strataTransportRccl == 4 && strataTransportCudaLocal == 5,
               "transport values");

static int all_zero(const char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0) return 0;
  return 1;
}

/* A vendor transport's id: made (library built with its feature and the vendor library
   loadable) or refused with the feature's name. Returns 1 when made. */
static int vendor_id_or_not_compiled(strataResult_t rc, const strataUniqueId *id, const char *feature) {
  const char *m = strataGetLastError(NULL);
  if (rc == strataSuccess) {
    CHECK(memcmp(id->internal, "STRATAID", 8) == 0, "vendor id magic");
    CHECK(!all_zero(id->internal + STRATA_UNIQUE_ID_VENDOR_OFFSET, 128), "vendor id embedded");
    return 1;
  }
  if (rc == strataInvalidUsage && strstr(m, feature) != NULL) {
    atomic_fetch_add(&passed, 1);
    return 0;
  }
  /* Built with the feature but the vendor library cannot be loaded. */
  CHECK(rc == strataSystemError && m[0] != '\0', "vendor id -> %d (%s)", rc, m);
  return 0;
}

static void test_ids_and_transports(void) {
  strataUniqueId id, id2;
  memset(&id, 0x5a, sizeof id);
  OK(strataGetUniqueId(&id));
  CHECK(memcmp(id.internal, "STRATAID", 8) == 0, "id magic");
  CHECK(all_zero(id.internal + 29, sizeof id - 29), "plain id: no vendor flag, no vendor id");
  OK(strataGetUniqueIdForTransport(strataTransportLocal, &id2));
  CHECK(memcmp(id.internal + 12, id2.internal + 12, 16) != 0, "two ids, two worlds");
  OK(strataGetUniqueIdForTransport(strataTransportDefault, &id2));
  EXPECT(strataInvalidArgument, NULL, strataGetUniqueIdForTransport(strataTransportLocal, NULL));
  OK(strataGetUniqueIdForTransport(strataTransportHostLocal, &id2));
  EXPECT(strataInvalidArgument, NULL, strataGetUniqueIdForTransport(7, &id2));
  EXPECT(strataInvalidArgument, NULL, strataGetUniqueIdForTransport(-1, &id2));
  CHECK(strstr(strataGetLastError(NULL), "host-local") != NULL, "names the transports: %s", strataGetLastError(NULL));

  strataUniqueId nccl;
  memset(&nccl, 0, sizeof nccl);
  int have_nccl = vendor_id_or_not_compiled(strataGetUniqueIdForTransport(strataTransportNccl, &nccl), &nccl, "`cuda` feature");
  /* scripts/capi-test sets it for the --features cuda library, with libnccl at hand. */
  if (getenv("STRATA_REQUIRE_NCCL")) CHECK(have_nccl, "STRATA_REQUIRE_NCCL: no NCCL id (%s)", strataGetLastError(NULL));
  strataUniqueId rccl;
  memset(&rccl, 0, sizeof rccl);
  vendor_id_or_not_compiled(strataGetUniqueIdForTransport(strataTransportRccl, &rccl), &rccl, "`rocm` feature");
  /* STRATA_TRANSPORT=nccl: strataGetUniqueId embeds an NCCL id (or says what is missing);
     any other value makes a plain id. */
  setenv("STRATA_TRANSPORT", "nccl", 1);
  memset(&id2, 0, sizeof id2);
  int env_nccl = vendor_id_or_not_compiled(strataGetUniqueId(&id2), &id2, "`cuda` feature");
  CHECK(env_nccl == have_nccl, "STRATA_TRANSPORT=nccl agrees with strataGetUniqueIdForTransport");
  setenv("STRATA_TRANSPORT", "bogus", 1);
  OK(strataGetUniqueId(&id2));
  CHECK(all_zero(id2.internal + 29, sizeof id2 - 29), "plain id under STRATA_TRANSPORT=bogus");
  unsetenv("STRATA_TRANSPORT");

  /* Config transports. */
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  strataComm_t cs[2], c = NULL;
  cfg.transport = 7;
  EXPECT(strataInvalidArgument, NULL, strataCommInitLocal(cs, 2, NULL, &cfg));
  cfg.transport = strataTransportNccl;
  strataResult_t rc = strataCommInitLocal(cs, 2, NULL, &cfg);
  CHECK(rc == strataInvalidUsage ? strstr(strataGetLastError(NULL), "`cuda` feature") != NULL
                                 : rc == strataInvalidArgument &&
                                       strstr(strataGetLastError(NULL), "strataCommInitRankConfig") != NULL,
        "nccl is not an in-process world -> %d (%s)", rc, strataGetLastError(NULL));
  cfg.timeout_ms = 2000;
  /* A plain id on nccl: not compiled, or no NCCL id in it. */
  rc = strataCommInitRankConfig(&c, 1, id, 0, &cfg);
  CHECK(rc == strataInvalidUsage || rc == strataInvalidArgument, "nccl with a plain id -> %d", rc);
  CHECK(rc == strataInvalidUsage ? strstr(strataGetLastError(NULL), "`cuda` feature") != NULL
                                 : strstr(strataGetLastError(NULL), "strataGetUniqueIdForTransport") != NULL,
        "nccl with a plain id: %s", strataGetLastError(NULL));
  CHECK(c == NULL, "no communicator written on failure");
  cfg.transport = strataTransportRccl;
  rc = strataCommInitRankConfig(&c, 1, id, 0, &cfg);
  CHECK(rc == strataInvalidUsage || rc == strataInvalidArgument, "rccl with a plain id -> %d", rc);
  cfg.transport = strataTransportCudaLocal;
  rc = strataCommInitLocal(cs, 2, NULL, &cfg);
  if (rc == strataSuccess) { /* a cuda build on a machine with a GPU */
    strataTransport_t t = 0;
    OK(strataCommGetTransport(cs[0], &t));
    CHECK(t == strataTransportCudaLocal, "cuda-local transport %d", t);
    OK(strataCommDestroy(cs[0]));
    OK(strataCommDestroy(cs[1]));
  } else {
    CHECK(strlen(strataGetLastError(NULL)) > 0, "cuda-local failure message");
  }
}

static int local_mode(void) {
  enum { N = 8 };
  int version = 0;
  OK(strataGetVersion(&version));
  CHECK(version == STRATA_VERSION_CODE, "version %d vs header %d", version, STRATA_VERSION_CODE);
  test_ids_and_transports();

  /* A whole world from one call, each rank driven by its own thread. */
  strataComm_t comms[N];
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.timeout_ms = 20000;
  OK(strataCommInitLocal(comms, N, "nodes:2x4", &cfg));
  {
    strataTransport_t tr = -1;
    OK(strataCommGetTransport(comms[0], &tr));
    CHECK(tr == strataTransportLocal, "local world's transport %d", tr);
    EXPECT(strataInvalidArgument, comms[0], strataCommGetTransport(comms[0], NULL));
  }
  pthread_t t[N];
  for (int i = 0; i < N; i++)
    if (pthread_create(&t[i], NULL, rank_thread, comms[i])) FAIL("pthread_create");
  for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
  test_host_local();

  /* One thread driving all ranks: only possible inside a group (as NCCL). */
  float in[N][3], out[N][3 * N];
  OK(strataGroupStart());
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < 3; k++) in[i][k] = (float)(i * 3 + k);
    OK(strataAllGather(in[i], out[i], 3, strataFloat32, comms[i], NULL));
  }
  OK(strataGroupEnd());
  for (int i = 0; i < N; i++)
    for (int k = 0; k < 3 * N; k++) CHECK(out[i][k] == (float)k, "single-thread group all-gather");
  for (int i = 0; i < N; i++) OK(strataCommDestroy(comms[i]));
  /* Use after destroy, double destroy, abort. */
  float f = 0;
  EXPECT(strataInvalidUsage, comms[0], strataAllReduce(&f, &f, 1, strataFloat32, strataSum, comms[0], NULL));
  CHECK(strstr(strataGetLastError(comms[0]), "destroyed") != NULL, "destroy message: %s", strataGetLastError(comms[0]));
  EXPECT(strataInvalidUsage, NULL, strataCommDestroy(comms[0]));
  EXPECT(strataInvalidUsage, NULL, strataCommAbort(comms[1]));
  OK(strataCommDestroy(NULL));
  OK(strataCommAbort(NULL));
  strataComm_t two[2];
  OK(strataCommInitLocal(two, 2, NULL, NULL));
  OK(strataCommAbort(two[0]));
  EXPECT(strataInvalidUsage, NULL, strataCommCount(two[0], &version));
  OK(strataCommDestroy(two[1]));

  /* strataCommAbort from another thread wakes a call blocked on the communicator at once
     (its world's timeout is 20 s). */
  {
    strataComm_t w[2];
    strataConfig_t c20 = STRATA_CONFIG_INITIALIZER;
    c20.timeout_ms = 20000;
    OK(strataCommInitLocal(w, 2, NULL, &c20));
    struct blocked_arg a = {w[0], strataSuccess, ""};
    pthread_t bt;
    double t0 = now_s();
    pthread_create(&bt, NULL, blocked_thread, &a);
    struct timespec pause = {0, 100 * 1000 * 1000};
    nanosleep(&pause, NULL);
    OK(strataCommAbort(w[0]));
    pthread_join(bt, NULL);
    double dt = now_s() - t0;
    CHECK(a.got != strataSuccess && a.message[0] != '\0', "aborted call -> %d (%s)", a.got, a.message);
    CHECK(dt < 5.0, "abort took %.1f s to wake the blocked call", dt);
    OK(strataCommDestroy(w[1]));
  }

  /* Unique id + strataCommInitRankConfig from threads: 8 ranks on nodes:2x4 (hier), and 3 flat. */
  run_init_world(8, "nodes:2x4", 20000, NULL, 8);
  run_init_world(3, NULL, 20000, NULL, 3);
  {
    /* The plain strataCommInitRank path (STRATA_TRANSPORT unset: local), 1 rank. */
    strataUniqueId id;
    strataComm_t c;
    OK(strataGetUniqueId(&id));
    OK(strataCommInitRank(&c, 1, id, 0));
    OK(strataCommDestroy(c));
  }
  /* Only 1 of 2 ranks arrives: a remote error after the timeout, not a hang. */
  int expect_timeout[1] = {strataRemoteError};
  run_init_world(2, NULL, 200, expect_timeout, 1);
  /* Ranks disagreeing on nranks: invalid usage for the late one, timeout for the other. */
  {
    struct mismatch_arg a[2];
    pthread_t mt[2];
    OK(strataGetUniqueId(&a[0].id));
    a[1].id = a[0].id;
    a[0].nranks = 2, a[0].rank = 0;
    a[1].nranks = 3, a[1].rank = 1;
    pthread_create(&mt[0], NULL, mismatch_thread, &a[0]);
    pthread_join(mt[0], NULL); /* rank 0 times out alone first (300 ms) */
    CHECK(a[0].got == strataRemoteError, "lonely rank -> %d", a[0].got);
    /* Now both at once, rank 1 with the wrong nranks. */
    OK(strataGetUniqueId(&a[0].id));
    a[1].id = a[0].id;
    pthread_create(&mt[0], NULL, mismatch_thread, &a[0]);
    pthread_create(&mt[1], NULL, mismatch_thread, &a[1]);
    pthread_join(mt[0], NULL);
    pthread_join(mt[1], NULL);
    /* Whichever arrives second is the mismatch; the first then waits alone and times out. */
    CHECK((a[0].got == strataRemoteError && a[1].got == strataInvalidUsage) ||
              (a[1].got == strataRemoteError && a[0].got == strataInvalidUsage),
          "nranks mismatch -> %d, %d", a[0].got, a[1].got);
  }
  printf("local: %ld passed, 0 failed\n", (long)atomic_load(&passed));
  return 0;
}

/* ---- mpi mode ---- */

static int mpi_mode(void) {
  int rank, size;
  strataUniqueId id;
#ifdef STRATA_TEST_WITH_MPI
  int provided;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) FAIL("MPI without MPI_THREAD_MULTIPLE");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (rank == 0) OK(strataGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  const char *how = "mpi (host MPI)";
#else
  const char *er = getenv("OMPI_COMM_WORLD_RANK"), *es = getenv("OMPI_COMM_WORLD_SIZE");
  if (!er || !es) FAIL("--mpi without MPI linked needs mpirun (OMPI_COMM_WORLD_RANK/SIZE)");
  rank = atoi(er);
  size = atoi(es);
  OK(strataGetUniqueId(&id)); /* under mpi the id carries no rendezvous */
  const char *how = "mpi (strata-initialised MPI)";
#endif
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportMpi;
  cfg.timeout_ms = 30000;
  strataComm_t c = NULL;
  OK(strataCommInitRankConfig(&c, size, id, rank, &cfg));
  int r, n;
  OK(strataCommUserRank(c, &r));
  OK(strataCommCount(c, &n));
  CHECK(r == rank && n == size, "mpi world %d/%d vs %d/%d", r, n, rank, size);
  strataTransport_t tr = -1;
  OK(strataCommGetTransport(c, &tr));
  CHECK(tr == strataTransportMpi, "mpi world's transport %d", tr);
  rank_body(c);
  OK(strataCommDestroy(c));
  /* Wrong nranks: every rank fails together with invalid usage. */
  strataComm_t bad = NULL;
  EXPECT(strataInvalidUsage, NULL, strataCommInitRankConfig(&bad, size + 1, id, rank, &cfg));
#ifdef STRATA_TEST_WITH_MPI
  MPI_Finalize();
#else
  OK(strataFinalize());
#endif
  if (rank == 0) printf("%s np=%d: %ld passed, 0 failed\n", how, size, (long)atomic_load(&passed));
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc > 1 && strcmp(argv[1], "--mpi") == 0) return mpi_mode();
  if (argc > 1) FAIL("usage: %s [--mpi]", argv[0]);
  return local_mode();
}
