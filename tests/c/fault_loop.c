/*
 * A long collective loop through the C ABI on the mpi transport, for scripts/fault-check:
 * one rank is frozen or killed mid-loop and the job must end (non-zero, within the
 * timeout + 15 s, the failed peer named), never hang.
 *
 *   mpirun -np N fault_loop OP ALGO TOPOLOGY ITERS
 *     OP: all-gather | reduce-scatter | all-reduce | reduce-scatter-q (ZeRO++ qgZ, 4-bit)
 *     ALGO: ring | hier | ho-ring | auto (the communicator's default algorithm)
 *
 * With STRATA_FAULT_READY=PATH it creates PATH after its first collective (so the test
 * freezes a rank mid-loop, not mid-start). Built with plain cc, strata initialises MPI;
 * built with mpicc -DFAULT_HOST_MPI, the program does (MPI_Init_thread) and finalises
 * it. On the first failing call the program does what the docs ask of a C caller:
 * prints the error and strataGetLastError, destroys the communicator (must return) and
 * calls strataFinalize, which after a peer failure aborts the MPI job whoever
 * initialised MPI (MPI_Finalize would wait for the failed peer); it returns 1 if
 * strataFinalize ever returned.
 */
#include "strata.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef FAULT_HOST_MPI
#include <mpi.h>
#endif

static int fail(strataComm_t c, int rank, const char *what, strataResult_t rc) {
  fprintf(stderr, "fault_loop rank %d: %s -> %s: %s\n", rank, what, strataGetErrorString(rc),
          strataGetLastError(c));
  if (c) {
    strataResult_t d = strataCommDestroy(c);
    fprintf(stderr, "fault_loop rank %d: strataCommDestroy -> %d\n", rank, (int)d);
  }
  strataFinalize();
  fprintf(stderr, "fault_loop rank %d: strataFinalize returned after a failure\n", rank);
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: %s OP ALGO TOPOLOGY ITERS\n", argv[0]);
    return 2;
  }
  const char *op = argv[1];
  const char *er = getenv("OMPI_COMM_WORLD_RANK"), *es = getenv("OMPI_COMM_WORLD_SIZE");
  if (!er || !es) {
    fprintf(stderr, "fault_loop: run under mpirun\n");
    return 2;
  }
  int rank = atoi(er), size = atoi(es);
#ifdef FAULT_HOST_MPI
  int provided;
  MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
#endif
  long iters = atol(argv[4]);
  strataUniqueId id;
  strataResult_t rc = strataGetUniqueId(&id);
  if (rc != strataSuccess) return fail(NULL, rank, "strataGetUniqueId", rc);
  strataConfig_t cfg = STRATA_CONFIG_INITIALIZER;
  cfg.transport = strataTransportMpi;
  cfg.topology = argv[3];
  cfg.algo = argv[2];
  strataComm_t c = NULL;
  rc = strataCommInitRankConfig(&c, size, id, rank, &cfg);
  if (rc != strataSuccess) return fail(NULL, rank, "strataCommInitRankConfig", rc);

  size_t count = 1 << 16; /* elements per rank's block */
  float *send = calloc(count * (size_t)size, sizeof(float));
  float *recv = calloc(count * (size_t)size, sizeof(float));
  if (!send || !recv) return fail(c, rank, "calloc", strataSystemError);
  for (size_t i = 0; i < count * (size_t)size; i++) send[i] = (float)(rank + i % 7);
  for (long it = 0; it < iters; it++) {
    if (strcmp(op, "all-gather") == 0)
      rc = strataAllGather(send, recv, count, strataFloat32, c, NULL);
    else if (strcmp(op, "reduce-scatter") == 0)
      rc = strataReduceScatter(send, recv, count, strataFloat32, strataSum, c, NULL);
    else if (strcmp(op, "all-reduce") == 0)
      rc = strataAllReduce(send, recv, count, strataFloat32, strataSum, c, NULL);
    else if (strcmp(op, "reduce-scatter-q") == 0)
      rc = strataReduceScatterQuantized(send, recv, count, strataFloat32, strataSum, 4, 256, c, NULL);
    else {
      fprintf(stderr, "fault_loop: unknown op %s\n", op);
      return 2;
    }
    if (rc != strataSuccess) return fail(c, rank, op, rc);
    const char *ready = getenv("STRATA_FAULT_READY");
    if (it == 0 && ready) {
      FILE *f = fopen(ready, "w");
      if (f) fclose(f);
    }
  }
  free(send);
  free(recv);
  rc = strataCommDestroy(c);
  if (rc != strataSuccess) return fail(NULL, rank, "strataCommDestroy", rc);
#ifdef FAULT_HOST_MPI
  MPI_Finalize();
#else
  strataFinalize();
#endif
  return 0;
}
