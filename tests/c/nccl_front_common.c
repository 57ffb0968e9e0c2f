/* The checks shared by nccl_front_local.c (one process, N ranks) and nccl_front_mpi.c
 * (one rank per process): #included by both, never compiled alone.
 *
 * Written as an NCCL program is: NCCL's own nccl.h (the nvidia-nccl-cu12 wheel's), no
 * strata header, run on strata's CPU device (STRATA_NCCL_DEVICE=cpu) where host memory
 * (malloc or ncclMemAlloc) stands in for device memory and the stream is NULL. Every
 * collective is issued for all of a process's ranks inside ncclGroupStart/ncclGroupEnd
 * and its result checked element by element against a reference computed here from the
 * same generators (so a process knows every rank's input without communicating).
 *
 * Values: small integers, exact in every type (half and bfloat16 are built bit by bit
 * from them), chosen so sums, products and averages stay exact and in range: only the
 * float types' averages are compared with a tolerance (NCCL pre-multiplies by 1/n). */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <nccl.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- results ---- */

static long g_checks = 0;  /* cases checked */
static long g_fail = 0;    /* cases that failed */
static int g_print = 1;    /* this process prints the per-check lines */
static const char *g_who = ""; /* "" or "[rank R] " (MPI), before failure lines */

#define NCCLCHECK(call)                                                                   \
  do {                                                                                    \
    ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) {                                                              \
      fprintf(stderr, "%sFAIL %s:%d: %s returned %d (%s); ncclGetLastError: %s\n", g_who, \
              __FILE__, __LINE__, #call, (int)r_, ncclGetErrorString(r_),                 \
              ncclGetLastError(NULL));                                                    \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "%sFAIL %s:%d: ", g_who, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                       \
      fprintf(stderr, "\n");                              \
      exit(1);                                            \
    }                                                     \
  } while (0)

/* ---- data types ---- */

typedef struct {
  ncclDataType_t t;
  const char *name;
  size_t size;
  int is_signed;
  int is_float;
} dtype_t;

static const dtype_t DTYPES[] = {
    {ncclInt8, "int8", 1, 1, 0},       {ncclUint8, "uint8", 1, 0, 0},
    {ncclInt32, "int32", 4, 1, 0},     {ncclUint32, "uint32", 4, 0, 0},
    {ncclInt64, "int64", 8, 1, 0},     {ncclUint64, "uint64", 8, 0, 0},
    {ncclFloat16, "half", 2, 1, 1},    {ncclFloat32, "float", 4, 1, 1},
    {ncclFloat64, "double", 8, 1, 1},  {ncclBfloat16, "bfloat16", 2, 1, 1},
};
#define NDTYPES ((int)(sizeof(DTYPES) / sizeof(DTYPES[0])))

static const dtype_t *dtype_of(ncclDataType_t t) {
  for (int i = 0; i < NDTYPES; i++)
    if (DTYPES[i].t == t) return &DTYPES[i];
  return NULL;
}

/* IEEE half from a double (round to nearest even), and back. */
static uint16_t half_bits(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int e8 = (int)((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffffu;
  if (e8 == 0) return (uint16_t)sign;
  if (e8 == 255) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
  int exp = e8 - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    mant |= 0x800000u;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (mant >> 13), rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return (uint16_t)(sign | h);
}

static double half_value(uint16_t h) {
  int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0)
    v = ldexp(mant, -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = ldexp(mant + 1024, exp - 25);
  return (h & 0x8000) ? -v : v;
}

/* bfloat16: the top half of a float (round to nearest even), and back. */
static uint16_t bf16_bits(double d) {
  float f = (float)d;
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

static double bf16_value(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(const dtype_t *d, void *buf, size_t i, double v) {
  switch (d->t) {
    case ncclInt8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t *)buf)[i] = half_bits(v); break;
    case ncclFloat32: ((float *)buf)[i] = (float)v; break;
    case ncclFloat64: ((double *)buf)[i] = v; break;
    case ncclBfloat16: ((uint16_t *)buf)[i] = bf16_bits(v); break;
    default: EXPECT(0, "put: type %d", (int)d->t);
  }
}

static double get(const dtype_t *d, const void *buf, size_t i) {
  switch (d->t) {
    case ncclInt8: return ((const int8_t *)buf)[i];
    case ncclUint8: return ((const uint8_t *)buf)[i];
    case ncclInt32: return ((const int32_t *)buf)[i];
    case ncclUint32: return ((const uint32_t *)buf)[i];
    case ncclInt64: return (double)((const int64_t *)buf)[i];
    case ncclUint64: return (double)((const uint64_t *)buf)[i];
    case ncclFloat16: return half_value(((const uint16_t *)buf)[i]);
    case ncclFloat32: return ((const float *)buf)[i];
    case ncclFloat64: return ((const double *)buf)[i];
    case ncclBfloat16: return bf16_value(((const uint16_t *)buf)[i]);
    default: EXPECT(0, "get: type %d", (int)d->t);
  }
  return 0;
}

/* ---- inputs and references ---- */

enum { GEN_PLAIN, GEN_SUM, GEN_PROD, GEN_MAXMIN };

/* Element i of rank r's input (of n ranks). GEN_SUM: g(i) plus n on one rank per
 * element, so the sum is n*(g(i)+1) and the average g(i)+1, exact; GEN_PROD: 1, 2 or -1
 * (at most two 2s per element up to 8 ranks); GEN_PLAIN: distinct-ish per (r, i), for
 * the data-movement collectives. Every value fits int8/uint8 and is exact in bfloat16. */
static double gen(int kind, const dtype_t *d, int n, int r, size_t i) {
  switch (kind) {
    case GEN_SUM: {
      double g = (double)((i * 7 + 3) % 5) - (d->is_signed ? 2 : 0);
      return g + ((size_t)r == i % (size_t)n ? n : 0);
    }
    case GEN_PROD: {
      double v = ((i + (size_t)r) % 4 == 0) ? 2 : 1;
      if (d->is_signed && (i + 2 * (size_t)r) % 5 == 1) v = -v;
      return v;
    }
    case GEN_MAXMIN:
      return (double)((i * 5 + (size_t)r * 3) % 11) - (d->is_signed ? 5 : 0);
    default:
      return (double)(((size_t)r * 31 + i * 7 + 1) % 97) - (d->is_signed ? 48 : 0);
  }
}

#define OP_PREMUL 5
static const char *const OP_NAMES[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
static const double PREMUL_SCALAR = 2.0;

static int gen_kind_of(int op) {
  switch (op) {
    case ncclProd: return GEN_PROD;
    case ncclMax:
    case ncclMin: return GEN_MAXMIN;
    default: return GEN_SUM;
  }
}

static double ref_reduce(int op, const dtype_t *d, int n, size_t i) {
  int kind = gen_kind_of(op);
  double acc = gen(kind, d, n, 0, i);
  for (int r = 1; r < n; r++) {
    double v = gen(kind, d, n, r, i);
    switch (op) {
      case ncclProd: acc *= v; break;
      case ncclMax: acc = v > acc ? v : acc; break;
      case ncclMin: acc = v < acc ? v : acc; break;
      default: acc += v; break;
    }
  }
  if (op == ncclAvg) acc /= n; /* exact: the sum is a multiple of n */
  if (op == OP_PREMUL) acc *= PREMUL_SCALAR;
  return acc;
}

/* ---- worlds ---- */

/* A communicator as one process sees it: nlocal of its n ranks, comm[k] of rank rank[k]. */
typedef struct {
  const char *name;
  int n;
  int nlocal;
  ncclComm_t *comm;
  int *rank;
  int nonblocking; /* made with blocking=0: calls may return ncclInProgress */
} world_t;

/* Waits out ncclInProgress on every local communicator (nonblocking ones); fails on an error. */
static void wait_world(const world_t *w, const char *what) {
  for (int k = 0; k < w->nlocal; k++) {
    ncclResult_t st;
    long polls = 0;
    do {
      NCCLCHECK(ncclCommGetAsyncError(w->comm[k], &st));
      if (st == ncclInProgress) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        EXPECT(++polls < 600000, "%s: %s: rank %d still ncclInProgress after 60 s", w->name, what,
               w->rank[k]);
      }
    } while (st == ncclInProgress);
    EXPECT(st == ncclSuccess, "%s: %s: rank %d: ncclCommGetAsyncError %d (%s): %s", w->name, what,
           w->rank[k], (int)st, ncclGetErrorString(st), ncclGetLastError(w->comm[k]));
  }
}

/* A call's result: success, or in progress on a nonblocking communicator. */
static void call_ok(const world_t *w, ncclResult_t rc, const char *what, int rank) {
  if (rc == ncclSuccess || (w->nonblocking && rc == ncclInProgress)) return;
  fprintf(stderr, "%sFAIL %s: %s on rank %d returned %d (%s); ncclGetLastError: %s\n", g_who,
          w->name, what, rank, (int)rc, ncclGetErrorString(rc), ncclGetLastError(NULL));
  exit(1);
}

static void group_end(const world_t *w, const char *what) {
  ncclResult_t rc = ncclGroupEnd();
  call_ok(w, rc, what, -1);
  if (w->nonblocking) wait_world(w, what);
}

/* ---- buffers ---- */

#define MAXCOUNT 1003
#define GUARD 64
#define SENTINEL 0xA5

typedef struct {
  size_t cap; /* bytes usable; GUARD more follow */
  void **send, **recv;
  int from_nccl; /* ncclMemAlloc'd */
} bufs_t;

static void bufs_alloc(bufs_t *b, const world_t *w, size_t maxcount, int use_nccl_alloc) {
  b->cap = (size_t)w->n * maxcount * 8;
  b->send = calloc((size_t)w->nlocal, sizeof(void *));
  b->recv = calloc((size_t)w->nlocal, sizeof(void *));
  b->from_nccl = use_nccl_alloc;
  for (int k = 0; k < w->nlocal; k++) {
    if (use_nccl_alloc) {
      NCCLCHECK(ncclMemAlloc(&b->send[k], b->cap + GUARD));
      NCCLCHECK(ncclMemAlloc(&b->recv[k], b->cap + GUARD));
    } else {
      b->send[k] = malloc(b->cap + GUARD);
      b->recv[k] = malloc(b->cap + GUARD);
    }
    EXPECT(b->send[k] && b->recv[k], "out of memory");
  }
}

static void bufs_free(bufs_t *b, const world_t *w) {
  for (int k = 0; k < w->nlocal; k++) {
    if (b->from_nccl) {
      NCCLCHECK(ncclMemFree(b->send[k]));
      NCCLCHECK(ncclMemFree(b->recv[k]));
    } else {
      free(b->send[k]);
      free(b->recv[k]);
    }
  }
  free(b->send);
  free(b->recv);
}

/* ---- one collective, checked ---- */

enum {
  C_ALLREDUCE,
  C_REDUCE,
  C_REDUCESCATTER,
  C_ALLGATHER,
  C_BROADCAST,
  C_BCAST,
  C_ALLTOALL,
  C_GATHER,
  C_SCATTER,
  C_SENDRECV,
  C_COUNT
};
static const char *const COLL_NAMES[] = {"allreduce", "reduce",  "reducescatter", "allgather",
                                         "broadcast", "bcast",   "alltoall",      "gather",
                                         "scatter",   "sendrecv"};

static int coll_reduces(int c) { return c == C_ALLREDUCE || c == C_REDUCE || c == C_REDUCESCATTER; }

typedef struct {
  int coll;
  const dtype_t *d;
  int op;          /* ncclRedOp_t of the builtins, or OP_PREMUL */
  int scalar_dev;  /* PreMulSum's scalar in "device" memory (ncclScalarDevice) */
  size_t count;
  int inplace;
  int root;
} case_t;

/* Where rank r's input lies and how many elements (its generator index j runs from 0). */
static void layout(const case_t *c, int n, int r, void *send, void *recv, void **in, size_t *in_n,
                   void **out, size_t *out_n) {
  size_t cnt = c->count, es = c->d->size;
  char *s = send, *v = recv;
  *in = s;
  *out = v;
  *in_n = cnt;
  *out_n = cnt;
  switch (c->coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
      if (c->inplace) *in = v;
      if (c->coll == C_REDUCE && r != c->root) *out_n = 0;
      break;
    case C_REDUCESCATTER:
      *in_n = (size_t)n * cnt;
      if (c->inplace) {
        *in = v;
        *out = v + (size_t)r * cnt * es;
      }
      break;
    case C_ALLGATHER:
      *out_n = (size_t)n * cnt;
      if (c->inplace) *in = v + (size_t)r * cnt * es;
      break;
    case C_BROADCAST:
    case C_BCAST:
      if (c->inplace) {
        *in = v;
        if (r != c->root) *in_n = 0;
      }
      break;
    case C_ALLTOALL:
      *in_n = (size_t)n * cnt;
      *out_n = (size_t)n * cnt;
      break;
    case C_GATHER:
      *out_n = r == c->root ? (size_t)n * cnt : 0;
      if (c->inplace && r == c->root) *in = v + (size_t)r * cnt * es;
      break;
    case C_SCATTER:
      *in_n = r == c->root ? (size_t)n * cnt : 0;
      if (c->inplace && r == c->root) {
        *in = s;
        *out = s + (size_t)r * cnt * es;
      }
      break;
    case C_SENDRECV: break;
  }
}

static double expected(const case_t *c, int n, int r, size_t j) {
  size_t cnt = c->count;
  const dtype_t *d = c->d;
  switch (c->coll) {
    case C_ALLREDUCE:
    case C_REDUCE: return ref_reduce(c->op, d, n, j);
    case C_REDUCESCATTER: return ref_reduce(c->op, d, n, (size_t)r * cnt + j);
    case C_ALLGATHER:
    case C_GATHER: return gen(GEN_PLAIN, d, n, (int)(j / cnt), j % cnt);
    case C_BROADCAST:
    case C_BCAST: return gen(GEN_PLAIN, d, n, c->root, j);
    case C_ALLTOALL: return gen(GEN_PLAIN, d, n, (int)(j / cnt), (size_t)r * cnt + j % cnt);
    case C_SCATTER: return gen(GEN_PLAIN, d, n, c->root, (size_t)r * cnt + j);
    case C_SENDRECV: return gen(GEN_PLAIN, d, n, (r + n - 1) % n, j);
  }
  return 0;
}

static int close_enough(const case_t *c, double got, double want) {
  if (got == want) return 1;
  if (!(c->d->is_float && c->op == ncclAvg && coll_reduces(c->coll))) return 0;
  double tol = c->d->t == ncclFloat16 ? 5e-3 : c->d->t == ncclBfloat16 ? 3e-2
             : c->d->t == ncclFloat32 ? 1e-6 : 1e-12;
  return fabs(got - want) <= tol * (fabs(want) > 1 ? fabs(want) : 1);
}

static void describe(char *out, size_t len, const world_t *w, const case_t *c) {
  snprintf(out, len, "%s %s %s%s%s count=%zu %s root=%d", w->name, COLL_NAMES[c->coll], c->d->name,
           coll_reduces(c->coll) ? " " : "", coll_reduces(c->coll) ? OP_NAMES[c->op] : "", c->count,
           c->inplace ? "in-place" : "out-of-place", c->root);
}

/* Runs one case on every local rank in one group and checks it; returns 0 when right. */
static int run_case(const world_t *w, bufs_t *b, const case_t *c) {
  int n = w->n, fails = 0;
  size_t es = c->d->size;
  char desc[200];
  describe(desc, sizeof desc, w, c);
  void *in[64], *out[64];
  size_t in_n[64], out_n[64];
  EXPECT(w->nlocal <= 64, "too many local ranks");
  ncclRedOp_t ops[64];
  uint64_t scalar_host[1];
  uint64_t *scalar_dev[64];
  int kind = coll_reduces(c->coll) ? gen_kind_of(c->op) : GEN_PLAIN;

  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    memset(b->send[k], SENTINEL, b->cap + GUARD);
    memset(b->recv[k], SENTINEL, b->cap + GUARD);
    layout(c, n, r, b->send[k], b->recv[k], &in[k], &in_n[k], &out[k], &out_n[k]);
    for (size_t j = 0; j < in_n[k]; j++) put(c->d, in[k], j, gen(kind, c->d, n, r, j));
    ops[k] = (ncclRedOp_t)c->op;
    scalar_dev[k] = NULL;
    if (c->op == OP_PREMUL && coll_reduces(c->coll)) {
      void *sc = scalar_host;
      if (c->scalar_dev) {
        NCCLCHECK(ncclMemAlloc((void **)&scalar_dev[k], 8));
        sc = scalar_dev[k];
      }
      put(c->d, sc, 0, PREMUL_SCALAR);
      NCCLCHECK(ncclRedOpCreatePreMulSum(&ops[k], sc, c->d->t,
                                         c->scalar_dev ? ncclScalarDevice : ncclScalarHostImmediate,
                                         w->comm[k]));
      /* Host-immediate: read before the call returns, so it may change now. */
      if (!c->scalar_dev) memset(scalar_host, 0, sizeof scalar_host);
    }
  }

  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    ncclComm_t cm = w->comm[k];
    ncclDataType_t t = c->d->t;
    char *s = b->send[k], *v = b->recv[k];
    const void *sb = in[k];
    void *rb = out[k];
    ncclResult_t rc = ncclSuccess;
    switch (c->coll) {
      case C_ALLREDUCE: rc = ncclAllReduce(sb, rb, c->count, t, ops[k], cm, NULL); break;
      case C_REDUCE:
        rc = ncclReduce(sb, c->inplace ? (void *)sb : v, c->count, t, ops[k], c->root, cm, NULL);
        break;
      case C_REDUCESCATTER: rc = ncclReduceScatter(sb, rb, c->count, t, ops[k], cm, NULL); break;
      case C_ALLGATHER: rc = ncclAllGather(sb, v, c->count, t, cm, NULL); break;
      case C_BROADCAST:
        rc = ncclBroadcast(c->inplace ? v : s, v, c->count, t, c->root, cm, NULL);
        break;
      case C_BCAST: rc = ncclBcast(v, c->count, t, c->root, cm, NULL); break;
      case C_ALLTOALL: rc = ncclAlltoAll(s, v, c->count, t, cm, NULL); break;
      case C_GATHER: rc = ncclGather(sb, v, c->count, t, c->root, cm, NULL); break;
      case C_SCATTER: rc = ncclScatter(s, rb, c->count, t, c->root, cm, NULL); break;
      case C_SENDRECV:
        rc = ncclSend(s, c->count, t, (r + 1) % n, cm, NULL);
        call_ok(w, rc, "ncclSend", r);
        rc = ncclRecv(v, c->count, t, (r + n - 1) % n, cm, NULL);
        break;
    }
    call_ok(w, rc, desc, r);
  }
  group_end(w, desc);

  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    for (size_t j = 0; j < out_n[k]; j++) {
      double want = expected(c, n, r, j), got = get(c->d, out[k], j);
      if (!close_enough(c, got, want)) {
        if (fails < 3)
          fprintf(stderr, "%sFAIL %s: rank %d element %zu: got %g, want %g\n", g_who, desc, r, j,
                  got, want);
        fails++;
        break;
      }
    }
    if (!c->inplace) {
      /* The input is untouched and nothing is written past the output. */
      for (size_t j = 0; j < in_n[k]; j++) {
        double want = gen(kind, c->d, n, r, j), got = get(c->d, in[k], j);
        if (got != want) {
          fprintf(stderr, "%sFAIL %s: rank %d: the send buffer changed at element %zu: %g, was %g\n",
                  g_who, desc, r, j, got, want);
          fails++;
          break;
        }
      }
      const unsigned char *g = (const unsigned char *)out[k] + out_n[k] * es;
      for (size_t j = 0; j < GUARD; j++)
        if (g[j] != SENTINEL) {
          fprintf(stderr, "%sFAIL %s: rank %d: byte %zu after the output was written\n", g_who,
                  desc, r, j);
          fails++;
          break;
        }
    }
    if (c->op == OP_PREMUL && coll_reduces(c->coll)) {
      NCCLCHECK(ncclRedOpDestroy(ops[k], w->comm[k]));
      if (scalar_dev[k]) NCCLCHECK(ncclMemFree(scalar_dev[k]));
    }
  }
  g_checks++;
  if (fails) g_fail++;
  return fails;
}

/* ---- the matrix: every served collective x type x op x count x placement ---- */

static const size_t COUNTS[] = {1, 7, MAXCOUNT};
#define NCOUNTS 3

static void check_matrix(const world_t *w, bufs_t *b) {
  for (int coll = 0; coll < C_COUNT; coll++) {
    for (int ti = 0; ti < NDTYPES; ti++) {
      long cases = 0, bad = 0;
      int nops = coll_reduces(coll) ? 6 : 1;
      for (int op = 0; op < nops; op++) {
        for (int ci = 0; ci < NCOUNTS; ci++) {
          for (int inplace = 0; inplace < 2; inplace++) {
            if (coll == C_BCAST && !inplace) continue;    /* in place by definition */
            if ((coll == C_ALLTOALL || coll == C_SENDRECV) && inplace) continue;
            case_t c = {coll, &DTYPES[ti], op, 0, COUNTS[ci], inplace, (ci + 1) % w->n};
            /* PreMulSum's scalar in "device" memory on the largest count. */
            if (op == OP_PREMUL && ci == NCOUNTS - 1) c.scalar_dev = 1;
            bad += run_case(w, b, &c) != 0;
            cases++;
          }
        }
      }
      if (g_print)
        printf("%s %s %s %s: %ld cases (%s; counts 1 7 %d; %s)\n", bad ? "FAIL" : "ok", w->name,
               COLL_NAMES[coll], DTYPES[ti].name, cases,
               coll_reduces(coll) ? "sum prod max min avg premulsum" : "no op", MAXCOUNT,
               coll == C_BCAST ? "in place" : (coll == C_ALLTOALL || coll == C_SENDRECV)
                                                  ? "out of place" : "in and out of place");
    }
  }
}

/* A few cases (one per collective kind) for a derived communicator. */
static void check_some(const world_t *w, bufs_t *b) {
  static const int colls[] = {C_ALLREDUCE, C_REDUCESCATTER, C_ALLGATHER, C_BROADCAST, C_SENDRECV};
  long bad = 0, cases = 0;
  for (size_t i = 0; i < sizeof colls / sizeof colls[0]; i++) {
    case_t c = {colls[i], dtype_of(ncclFloat32), ncclSum, 0, 7, 0, 0};
    if (colls[i] == C_ALLREDUCE) c.d = dtype_of(ncclBfloat16);
    if (colls[i] == C_REDUCESCATTER) c.op = ncclMax, c.d = dtype_of(ncclInt64);
    bad += run_case(w, b, &c) != 0;
    c.count = 1000;
    c.inplace = colls[i] != C_SENDRECV;
    c.root = w->n - 1;
    bad += run_case(w, b, &c) != 0;
    cases += 2;
  }
  if (g_print)
    printf("%s %s: allreduce reducescatter allgather broadcast sendrecv: %ld cases\n",
           bad ? "FAIL" : "ok", w->name, cases);
}

/* One group of mixed work: an all-gather, a reduce-scatter (avg) and a send/recv ring in
 * both directions, each in its own buffers, checked together. */
static void check_grouped_mix(const world_t *w) {
  int n = w->n;
  const dtype_t *tf = dtype_of(ncclFloat32), *ti = dtype_of(ncclInt32), *td = dtype_of(ncclFloat64);
  size_t ag = 7, rs = 5, sr = 3;
  long bad = 0;
  void **agin = calloc((size_t)w->nlocal, sizeof(void *)), **agout = calloc((size_t)w->nlocal, sizeof(void *));
  void **rsin = calloc((size_t)w->nlocal, sizeof(void *)), **rsout = calloc((size_t)w->nlocal, sizeof(void *));
  void **s1 = calloc((size_t)w->nlocal, sizeof(void *)), **r1 = calloc((size_t)w->nlocal, sizeof(void *));
  void **r2 = calloc((size_t)w->nlocal, sizeof(void *));
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    agin[k] = malloc(ag * 4);
    agout[k] = malloc((size_t)n * ag * 4);
    rsin[k] = malloc((size_t)n * rs * 4);
    rsout[k] = malloc(rs * 4);
    s1[k] = malloc(sr * 8);
    r1[k] = malloc(sr * 8);
    r2[k] = malloc(sr * 8);
    for (size_t j = 0; j < ag; j++) put(tf, agin[k], j, gen(GEN_PLAIN, tf, n, r, j));
    for (size_t j = 0; j < (size_t)n * rs; j++) put(ti, rsin[k], j, gen(GEN_SUM, ti, n, r, j));
    for (size_t j = 0; j < sr; j++) put(td, s1[k], j, gen(GEN_PLAIN, td, n, r, j));
    memset(r1[k], 0, sr * 8);
    memset(r2[k], 0, sr * 8);
  }
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    ncclComm_t cm = w->comm[k];
    call_ok(w, ncclAllGather(agin[k], agout[k], ag, ncclFloat32, cm, NULL), "mix ncclAllGather", r);
    call_ok(w, ncclReduceScatter(rsin[k], rsout[k], rs, ncclInt32, ncclAvg, cm, NULL),
            "mix ncclReduceScatter", r);
    call_ok(w, ncclSend(s1[k], sr, ncclFloat64, (r + 1) % n, cm, NULL), "mix ncclSend", r);
    call_ok(w, ncclRecv(r1[k], sr, ncclFloat64, (r + n - 1) % n, cm, NULL), "mix ncclRecv", r);
    call_ok(w, ncclSend(s1[k], sr, ncclFloat64, (r + n - 1) % n, cm, NULL), "mix ncclSend", r);
    call_ok(w, ncclRecv(r2[k], sr, ncclFloat64, (r + 1) % n, cm, NULL), "mix ncclRecv", r);
  }
  group_end(w, "grouped mix");
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    for (size_t j = 0; j < (size_t)n * ag; j++)
      if (get(tf, agout[k], j) != gen(GEN_PLAIN, tf, n, (int)(j / ag), j % ag)) {
        fprintf(stderr, "%sFAIL %s mix: all-gather rank %d element %zu\n", g_who, w->name, r, j);
        bad++;
        break;
      }
    for (size_t j = 0; j < rs; j++)
      if (get(ti, rsout[k], j) != ref_reduce(ncclAvg, ti, n, (size_t)r * rs + j)) {
        fprintf(stderr, "%sFAIL %s mix: reduce-scatter avg rank %d element %zu: %g want %g\n", g_who,
                w->name, r, j, get(ti, rsout[k], j), ref_reduce(ncclAvg, ti, n, (size_t)r * rs + j));
        bad++;
        break;
      }
    for (size_t j = 0; j < sr; j++) {
      if (get(td, r1[k], j) != gen(GEN_PLAIN, td, n, (r + n - 1) % n, j) ||
          get(td, r2[k], j) != gen(GEN_PLAIN, td, n, (r + 1) % n, j)) {
        fprintf(stderr, "%sFAIL %s mix: send/recv rank %d element %zu\n", g_who, w->name, r, j);
        bad++;
        break;
      }
    }
    free(agin[k]), free(agout[k]), free(rsin[k]), free(rsout[k]), free(s1[k]), free(r1[k]), free(r2[k]);
  }
  free(agin), free(agout), free(rsin), free(rsout), free(s1), free(r1), free(r2);
  g_checks++;
  if (bad) g_fail++;
  if (g_print)
    printf("%s %s grouped mix: allgather + reducescatter(avg) + send/recv both ways in one group\n",
           bad ? "FAIL" : "ok", w->name);
}

/* Per-call collective configs: ncclAllReduceConfig with NCCL_COLLCONFIG_INITIALIZER and
 * with NULL (the plain call), ncclAllGatherConfig. */
static void check_config_calls(const world_t *w, bufs_t *b) {
  int n = w->n;
  long bad = 0;
  const dtype_t *d = dtype_of(ncclFloat32);
  size_t cnt = 7;
  for (int variant = 0; variant < 2; variant++) {
    ncclCollConfig_t cfg = NCCL_COLLCONFIG_INITIALIZER;
    const ncclCollConfig_t *cp = variant ? NULL : &cfg;
    for (int k = 0; k < w->nlocal; k++) {
      memset(b->recv[k], 0, b->cap);
      for (size_t j = 0; j < cnt; j++) put(d, b->send[k], j, gen(GEN_SUM, d, n, w->rank[k], j));
    }
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < w->nlocal; k++) {
      call_ok(w, ncclAllReduceConfig(b->send[k], b->recv[k], cnt, ncclFloat32, ncclSum, w->comm[k], NULL, cp),
              "ncclAllReduceConfig", w->rank[k]);
      call_ok(w, ncclAllGatherConfig(b->send[k], (char *)b->recv[k] + 64, cnt, ncclFloat32, w->comm[k], NULL, cp),
              "ncclAllGatherConfig", w->rank[k]);
    }
    group_end(w, "nccl*Config");
    for (int k = 0; k < w->nlocal; k++) {
      for (size_t j = 0; j < cnt; j++)
        if (get(d, b->recv[k], j) != ref_reduce(ncclSum, d, n, j)) {
          fprintf(stderr, "%sFAIL %s ncclAllReduceConfig (%s config) rank %d element %zu\n", g_who,
                  w->name, variant ? "NULL" : "initialised", w->rank[k], j);
          bad++;
          break;
        }
      for (size_t j = 0; j < (size_t)n * cnt; j++)
        if (get(d, (char *)b->recv[k] + 64, j) != gen(GEN_SUM, d, n, (int)(j / cnt), j % cnt)) {
          fprintf(stderr, "%sFAIL %s ncclAllGatherConfig rank %d element %zu\n", g_who, w->name,
                  w->rank[k], j);
          bad++;
          break;
        }
    }
    g_checks++;
  }
  if (bad) g_fail++;
  if (g_print)
    printf("%s %s ncclAllReduceConfig/ncclAllGatherConfig: initialised and NULL collective configs\n",
           bad ? "FAIL" : "ok", w->name);
}

/* ncclCommCount, ncclCommUserRank, ncclCommCuDevice on every local rank. */
static void check_queries(const world_t *w) {
  for (int k = 0; k < w->nlocal; k++) {
    int count = -1, rank = -1, dev = -1;
    NCCLCHECK(ncclCommCount(w->comm[k], &count));
    NCCLCHECK(ncclCommUserRank(w->comm[k], &rank));
    NCCLCHECK(ncclCommCuDevice(w->comm[k], &dev));
    EXPECT(count == w->n, "%s: ncclCommCount %d, want %d", w->name, count, w->n);
    EXPECT(rank == w->rank[k], "%s: ncclCommUserRank %d, want %d", w->name, rank, w->rank[k]);
  }
  g_checks++;
  if (g_print)
    printf("ok %s queries: ncclCommCount=%d, ncclCommUserRank = rank on %d local ranks, ncclCommCuDevice\n",
           w->name, w->n, w->nlocal);
}

/* fp8 (ncclFloat8e4m3, ncclFloat8e5m2) is not served on the CPU device: an error code, no
 * hang; the error's strings printed. */
static void check_fp8_error(const world_t *w, bufs_t *b) {
  ncclDataType_t types[2] = {ncclFloat8e4m3, ncclFloat8e5m2};
  for (int t = 0; t < 2; t++) {
    ncclResult_t first = ncclSuccess;
    NCCLCHECK(ncclGroupStart());
    for (int k = 0; k < w->nlocal; k++) {
      ncclResult_t rc = ncclAllReduce(b->send[k], b->recv[k], 4, types[t], ncclSum, w->comm[k], NULL);
      if (rc != ncclSuccess && first == ncclSuccess) first = rc;
    }
    ncclResult_t end = ncclGroupEnd();
    if (first == ncclSuccess) first = end;
    EXPECT(first != ncclSuccess && first != ncclInProgress,
           "%s: ncclAllReduce of fp8 type %d returned success", w->name, (int)types[t]);
    if (g_print)
      printf("ok %s fp8 (type %d) all-reduce: error %d \"%s\"; ncclGetLastError: \"%s\"\n", w->name,
             (int)types[t], (int)first, ncclGetErrorString(first), ncclGetLastError(w->comm[0]));
    g_checks++;
  }
}

static void print_error_strings(void) {
  if (!g_print) return;
  printf("ok ncclGetErrorString:");
  for (int r = 0; r < (int)ncclNumResults; r++) printf(" %d=\"%s\"", r, ncclGetErrorString((ncclResult_t)r));
  printf("\n");
}

/* ---- derived communicators ---- */

/* The local ranks of w for which member() holds, as a world of `size` ranks (new ranks
 * from newrank()), their communicators from sub[]. */
static world_t sub_world(const world_t *w, const char *name, int size, ncclComm_t *sub,
                         int (*member)(int r, int n), int (*newrank)(int r, int n)) {
  world_t s = {name, size, 0, calloc((size_t)w->nlocal, sizeof(ncclComm_t)),
               calloc((size_t)w->nlocal, sizeof(int)), 0};
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    if (!member(r, w->n)) continue;
    EXPECT(sub[k] != NULL, "%s: rank %d got no communicator", name, r);
    s.comm[s.nlocal] = sub[k];
    s.rank[s.nlocal] = newrank(r, w->n);
    s.nlocal++;
  }
  return s;
}

static void free_world(world_t *s) {
  free(s->comm);
  free(s->rank);
}

static int is_even(int r, int n) { (void)n; return r % 2 == 0; }
static int is_odd(int r, int n) { (void)n; return r % 2 == 1; }
static int half_rank(int r, int n) { (void)n; return r / 2; }
static int not_last(int r, int n) { return r != n - 1; }
static int reversed(int r, int n) { return n - 2 - r; }
static int everyone(int r, int n) { (void)r, (void)n; return 1; }
static int same_rank(int r, int n) { (void)n; return r; }

/* ncclCommSplit by parity (key = rank) and a collective set on each half; the odd half
 * aborted (ncclCommAbort), the even half finalized and destroyed. Then a split with
 * NCCL_SPLIT_NOCOLOR on the last rank and keys reversing the order. */
static void check_splits(const world_t *w, bufs_t *b) {
  int n = w->n;
  ncclComm_t *sub = calloc((size_t)w->nlocal, sizeof(ncclComm_t));
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < w->nlocal; k++) NCCLCHECK(ncclCommSplit(w->comm[k], w->rank[k] % 2, w->rank[k], &sub[k], NULL));
  NCCLCHECK(ncclGroupEnd());
  world_t even = sub_world(w, "split-even", (n + 1) / 2, sub, is_even, half_rank);
  world_t odd = sub_world(w, "split-odd", n / 2, sub, is_odd, half_rank);
  if (even.nlocal) check_queries(&even), check_some(&even, b);
  if (odd.nlocal) check_queries(&odd), check_some(&odd, b);
  for (int k = 0; k < odd.nlocal; k++) NCCLCHECK(ncclCommAbort(odd.comm[k]));
  if (g_print && n > 1) printf("ok split-odd: ncclCommAbort on its %d ranks\n", n / 2);
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < even.nlocal; k++) NCCLCHECK(ncclCommFinalize(even.comm[k]));
  NCCLCHECK(ncclGroupEnd());
  for (int k = 0; k < even.nlocal; k++) NCCLCHECK(ncclCommDestroy(even.comm[k]));
  if (g_print) printf("ok split-even: ncclCommFinalize, ncclCommDestroy on its %d ranks\n", (n + 1) / 2);
  free_world(&even);
  free_world(&odd);

  memset(sub, 0, (size_t)w->nlocal * sizeof(ncclComm_t));
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < w->nlocal; k++) {
    int r = w->rank[k];
    NCCLCHECK(ncclCommSplit(w->comm[k], r == n - 1 ? NCCL_SPLIT_NOCOLOR : 7, n - r, &sub[k], NULL));
  }
  NCCLCHECK(ncclGroupEnd());
  for (int k = 0; k < w->nlocal; k++)
    EXPECT(w->rank[k] != n - 1 || sub[k] == NULL,
           "ncclCommSplit with NCCL_SPLIT_NOCOLOR gave rank %d a communicator", n - 1);
  world_t rest = sub_world(w, "split-nocolor", n - 1, sub, not_last, reversed);
  if (g_print) printf("ok split-nocolor: rank %d got no communicator (NCCL_SPLIT_NOCOLOR)\n", n - 1);
  if (rest.n > 0) {
    if (rest.nlocal) check_queries(&rest), check_some(&rest, b);
    for (int k = 0; k < rest.nlocal; k++) NCCLCHECK(ncclCommDestroy(rest.comm[k]));
  }
  free_world(&rest);
  free(sub);
}

/* A nonblocking split (config blocking=0): ncclInProgress is polled out with
 * ncclCommGetAsyncError, then collectives (which may return ncclInProgress too). */
static void check_nonblocking_split(const world_t *w, bufs_t *b) {
  ncclComm_t *sub = calloc((size_t)w->nlocal, sizeof(ncclComm_t));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking-split";
  NCCLCHECK(ncclGroupStart());
  for (int k = 0; k < w->nlocal; k++) {
    ncclResult_t rc = ncclCommSplit(w->comm[k], 0, w->rank[k], &sub[k], &cfg);
    EXPECT(rc == ncclSuccess || rc == ncclInProgress, "nonblocking ncclCommSplit: %d (%s)", (int)rc, ncclGetErrorString(rc));
  }
  ncclResult_t rc = ncclGroupEnd();
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "nonblocking split's ncclGroupEnd: %d (%s)", (int)rc, ncclGetErrorString(rc));
  world_t s = sub_world(w, "split-nonblocking", w->n, sub, everyone, same_rank);
  s.nonblocking = 1;
  wait_world(&s, "nonblocking ncclCommSplit");
  if (g_print) printf("ok split-nonblocking: ncclGroupEnd %d, then ncclCommGetAsyncError polled to ncclSuccess\n", (int)rc);
  check_queries(&s);
  check_some(&s, b);
  for (int k = 0; k < s.nlocal; k++) {
    rc = ncclCommDestroy(s.comm[k]);
    EXPECT(rc == ncclSuccess || rc == ncclInProgress, "ncclCommDestroy (nonblocking): %d", (int)rc);
  }
  free_world(&s);
  free(sub);
}

static int finish(const char *prog, int n) {
  if (g_fail) {
    fprintf(stderr, "%s%s FAILED n=%d: %ld of %ld checks failed\n", g_who, prog, n, g_fail, g_checks);
    return 1;
  }
  if (g_print) printf("%s OK n=%d checks=%ld\n", prog, n, g_checks);
  return 0;
}
