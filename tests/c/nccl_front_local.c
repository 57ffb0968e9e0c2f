/* nccl_front_local N: one process driving N ranks, as nccl-tests' `-g N` does, written as
 * an NCCL program (NCCL's nccl.h, no strata header) and run on libstrata_nccl.so with
 * STRATA_NCCL_DEVICE=cpu (scripts/nccl-front-check; docs/nccl.md):
 *
 *   ncclCommInitAll; every served collective (AllReduce, Reduce, ReduceScatter, AllGather,
 *   Broadcast, Bcast, AlltoAll, Gather, Scatter, Send/Recv) issued for all ranks in a group,
 *   in every type but fp8, every reduce op (PreMulSum by ncclRedOpCreatePreMulSum with the
 *   scalar on the host and in "device" memory), counts 1, 7 and 1003, in and out of place,
 *   into ncclMemAlloc'd buffers registered with ncclCommRegister; a group mixing an
 *   all-gather, a reduce-scatter and send/recv; the nccl*Config calls; ncclCommSplit by
 *   parity (one half aborted) and with NCCL_SPLIT_NOCOLOR; nonblocking init
 *   (ncclCommInitRankConfig with blocking=0 from N threads) and a nonblocking split, both
 *   polled with ncclCommGetAsyncError; ncclCommInitRank for every rank from one thread in
 *   a group; fp8 refused with an error code; ncclCommDestroy.
 *
 * One line per check; the last is `nccl_front_local OK n=N checks=K`; exit 1 on any wrong
 * result. */
#include "nccl_front_common.c"

#include <pthread.h>

typedef struct {
  int n, rank;
  ncclUniqueId id;
  ncclComm_t comm;
  ncclResult_t rc;
} init_arg_t;

static void *init_nonblocking(void *p) {
  init_arg_t *a = p;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  cfg.commName = "nonblocking-init";
  a->rc = ncclCommInitRankConfig(&a->comm, a->n, a->id, a->rank, &cfg);
  return NULL;
}

/* ncclCommInitRankConfig (blocking=0) from one thread per rank, polled to ncclSuccess. */
static void check_nonblocking_init(int n, bufs_t *b) {
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  init_arg_t *args = calloc((size_t)n, sizeof(init_arg_t));
  pthread_t *th = calloc((size_t)n, sizeof(pthread_t));
  for (int r = 0; r < n; r++) {
    args[r].n = n, args[r].rank = r, args[r].id = id;
    EXPECT(pthread_create(&th[r], NULL, init_nonblocking, &args[r]) == 0, "pthread_create");
  }
  int inprogress = 0;
  for (int r = 0; r < n; r++) {
    pthread_join(th[r], NULL);
    EXPECT(args[r].rc == ncclSuccess || args[r].rc == ncclInProgress,
           "nonblocking ncclCommInitRankConfig rank %d: %d (%s); %s", r, (int)args[r].rc,
           ncclGetErrorString(args[r].rc), ncclGetLastError(NULL));
    inprogress += args[r].rc == ncclInProgress;
  }
  ncclComm_t *comms = calloc((size_t)n, sizeof(ncclComm_t));
  int *ranks = calloc((size_t)n, sizeof(int));
  for (int r = 0; r < n; r++) comms[r] = args[r].comm, ranks[r] = r;
  world_t w = {"init-nonblocking", n, n, comms, ranks, 1};
  wait_world(&w, "nonblocking ncclCommInitRankConfig");
  printf("ok init-nonblocking: ncclCommInitRankConfig blocking=0 from %d threads (%d returned ncclInProgress), polled to ncclSuccess\n",
         n, inprogress);
  check_queries(&w);
  check_some(&w, b);
  for (int r = 0; r < n; r++) {
    ncclResult_t rc = ncclCommDestroy(comms[r]);
    EXPECT(rc == ncclSuccess || rc == ncclInProgress, "ncclCommDestroy (nonblocking): %d", (int)rc);
  }
  free(comms), free(ranks), free(args), free(th);
}

/* ncclCommInitRank for every rank from this one thread, inside a group (the NCCL way to
 * make several ranks from one thread without ncclCommInitAll). */
static void check_grouped_init(int n, bufs_t *b) {
  ncclUniqueId id;
  NCCLCHECK(ncclGetUniqueId(&id));
  ncclComm_t *comms = calloc((size_t)n, sizeof(ncclComm_t));
  int *ranks = calloc((size_t)n, sizeof(int));
  NCCLCHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    ranks[r] = r;
    NCCLCHECK(ncclCommInitRank(&comms[r], n, id, r));
  }
  NCCLCHECK(ncclGroupEnd());
  printf("ok init-grouped: ncclCommInitRank for %d ranks from one thread in a group\n", n);
  world_t w = {"init-grouped", n, n, comms, ranks, 0};
  check_queries(&w);
  check_some(&w, b);
  for (int r = 0; r < n; r++) NCCLCHECK(ncclCommDestroy(comms[r]));
  free(comms), free(ranks);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = argc > 1 ? atoi(argv[1]) : 4;
  EXPECT(n >= 1 && n <= 64, "usage: nccl_front_local N (1 to 64 ranks), got %s", argc > 1 ? argv[1] : "");

  int version = 0;
  NCCLCHECK(ncclGetVersion(&version));
  printf("ok ncclGetVersion: %d (header %d)\n", version, NCCL_VERSION_CODE);
  print_error_strings();

  ncclComm_t *comms = calloc((size_t)n, sizeof(ncclComm_t));
  int *ranks = calloc((size_t)n, sizeof(int));
  for (int r = 0; r < n; r++) ranks[r] = r;
  NCCLCHECK(ncclCommInitAll(comms, n, NULL));
  printf("ok ncclCommInitAll: %d ranks\n", n);
  world_t w = {"world", n, n, comms, ranks, 0};
  check_queries(&w);

  bufs_t b;
  bufs_alloc(&b, &w, MAXCOUNT, 1);
  void **handles = calloc((size_t)n, sizeof(void *));
  for (int k = 0; k < n; k++) {
    NCCLCHECK(ncclCommRegister(comms[k], b.send[k], b.cap + GUARD, &handles[k]));
  }
  printf("ok ncclMemAlloc, ncclCommRegister: %zu-byte buffers on %d ranks\n", b.cap + GUARD, n);

  check_matrix(&w, &b);
  check_grouped_mix(&w);
  check_config_calls(&w, &b);
  for (int k = 0; k < n; k++) NCCLCHECK(ncclCommDeregister(comms[k], handles[k]));
  printf("ok ncclCommDeregister\n");

  check_splits(&w, &b);
  check_nonblocking_split(&w, &b);
  check_nonblocking_init(n, &b);
  check_grouped_init(n, &b);
  check_fp8_error(&w, &b);

  for (int k = 0; k < n; k++) NCCLCHECK(ncclCommDestroy(comms[k]));
  printf("ok ncclCommDestroy: %d ranks\n", n);
  bufs_free(&b, &w);
  free(handles), free(comms), free(ranks);
  return finish("nccl_front_local", n);
}
