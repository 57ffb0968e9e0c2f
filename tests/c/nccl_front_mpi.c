/* nccl_front_mpi: one rank per process under mpirun, written as an NCCL program is
 * (NCCL's nccl.h, no strata header; mpicc) and run on libstrata_nccl.so with
 * STRATA_NCCL_DEVICE=cpu (scripts/nccl-front-check):
 *
 *   ncclGetUniqueId on rank 0, MPI_Bcast of the id, ncclCommInitRank; the same checks as
 *   nccl_front_local (every served collective, type but fp8, reduce op, count, placement;
 *   send/recv in groups; a grouped mix; the nccl*Config calls; splits, one half aborted;
 *   a nonblocking init and split; fp8 refused), on malloc'd buffers.
 *
 * Argument: --thread-multiple initialises MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE)
 * instead of MPI_Init.
 *
 * Rank 0 prints one line per check and `nccl_front_mpi OK n=N checks=K` when every rank
 * passed; a rank with a wrong result exits 1. */
#include "nccl_front_common.c"

#include <mpi.h>

static char who[32];

/* ncclCommInitRankConfig with blocking=0 (a second id from rank 0), polled to ncclSuccess. */
static void check_nonblocking_init(int n, int rank, bufs_t *b) {
  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, n, id, rank, &cfg);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "nonblocking ncclCommInitRankConfig: %d (%s); %s",
         (int)rc, ncclGetErrorString(rc), ncclGetLastError(NULL));
  world_t w = {"init-nonblocking", n, 1, &comm, &rank, 1};
  wait_world(&w, "nonblocking ncclCommInitRankConfig");
  if (g_print) printf("ok init-nonblocking: ncclCommInitRankConfig blocking=0 returned %d, polled to ncclSuccess\n", (int)rc);
  check_queries(&w);
  check_some(&w, b);
  rc = ncclCommDestroy(comm);
  EXPECT(rc == ncclSuccess || rc == ncclInProgress, "ncclCommDestroy (nonblocking): %d", (int)rc);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* MPI_Init as NCCL programs call it (nccl-tests does); --thread-multiple asks for
   * MPI_THREAD_MULTIPLE, which strata's mpi transport needs today. */
  int thread_multiple = argc > 1 && strcmp(argv[1], "--thread-multiple") == 0;
  if (thread_multiple) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    EXPECT(provided == MPI_THREAD_MULTIPLE, "MPI_Init_thread gave thread level %d, not MPI_THREAD_MULTIPLE", provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  int n, rank;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  snprintf(who, sizeof who, "[rank %d] ", rank);
  g_who = who;
  g_print = rank == 0;

  int version = 0;
  NCCLCHECK(ncclGetVersion(&version));
  if (g_print)
    printf("ok ncclGetVersion: %d (header %d), %d processes, MPI initialised by %s\n", version, NCCL_VERSION_CODE, n,
           thread_multiple ? "MPI_Init_thread(MPI_THREAD_MULTIPLE)" : "MPI_Init");
  print_error_strings();

  ncclUniqueId id;
  if (rank == 0) NCCLCHECK(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t comm = NULL;
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  if (g_print) printf("ok ncclGetUniqueId on rank 0, MPI_Bcast, ncclCommInitRank: %d ranks\n", n);
  world_t w = {"world", n, 1, &comm, &rank, 0};
  check_queries(&w);

  bufs_t b;
  bufs_alloc(&b, &w, MAXCOUNT, 0);
  check_matrix(&w, &b);
  check_grouped_mix(&w);
  check_config_calls(&w, &b);
  check_splits(&w, &b);
  check_nonblocking_split(&w, &b);
  check_nonblocking_init(n, rank, &b);
  check_fp8_error(&w, &b);

  NCCLCHECK(ncclCommDestroy(comm));
  if (g_print) printf("ok ncclCommDestroy\n");
  bufs_free(&b, &w);

  long fails = 0;
  MPI_Allreduce(&g_fail, &fails, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  int rc = finish("nccl_front_mpi", n);
  if (fails && !g_fail && g_print) fprintf(stderr, "nccl_front_mpi FAILED n=%d: %ld failed checks on other ranks\n", n, fails);
  MPI_Finalize();
  return rc || fails ? 1 : 0;
}
