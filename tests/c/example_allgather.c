/* docs/c-api.md's C example: 4 ranks on 2 nodes (nodes:2x2) of an in-process world, one
 * pthread per rank; all-gather, an in-place all-reduce, and an error with its message.
 *
 *   cargo build --release
 *   cc -Iinclude tests/c/example_allgather.c -Ltarget/release -lstrata -lpthread \
 *      -Wl,-rpath,$PWD/target/release -o example && ./example
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "strata.h"

#define NRANKS 4
#define COUNT 2

#define CHECK(call)                                                              \
  do {                                                                           \
    strataResult_t r_ = (call);                                                  \
    if (r_ != strataSuccess) {                                                   \
      fprintf(stderr, "%s failed: %s (%s)\n", #call, strataGetErrorString(r_),   \
              strataGetLastError(NULL));                                         \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static float gathered[NRANKS][NRANKS * COUNT];
static float summed[NRANKS][COUNT];

static void *rank_main(void *arg) {
  strataComm_t comm = (strataComm_t)arg;
  int rank, nranks;
  CHECK(strataCommUserRank(comm, &rank));
  CHECK(strataCommCount(comm, &nranks));

  float send[COUNT] = {rank * 10.0f, rank * 10.0f + 1.0f};
  /* Blocks until gathered[rank] holds every rank's `send`, rank-major. The stream
     argument is ignored on host transports. */
  CHECK(strataAllGather(send, gathered[rank], COUNT, strataFloat32, comm, NULL));

  summed[rank][0] = (float)rank;
  summed[rank][1] = 1.0f;
  /* In place (sendbuff == recvbuff), as in NCCL. */
  CHECK(strataAllReduce(summed[rank], summed[rank], COUNT, strataFloat32, strataSum, comm, NULL));
  return NULL;
}

int main(void) {
  int version;
  CHECK(strataGetVersion(&version));

  strataConfig_t config = STRATA_CONFIG_INITIALIZER;
  config.algo = "hier"; /* MiCS hierarchical all-gather over the 2 nodes */
  strataComm_t comms[NRANKS];
  CHECK(strataCommInitLocal(comms, NRANKS, "nodes:2x2", &config));

  pthread_t threads[NRANKS];
  for (int r = 0; r < NRANKS; r++) pthread_create(&threads[r], NULL, rank_main, comms[r]);
  for (int r = 0; r < NRANKS; r++) pthread_join(threads[r], NULL);

  printf("strata %d, %d ranks on nodes:2x2\n", version, NRANKS);
  for (int r = 0; r < NRANKS; r++) {
    printf("rank %d all-gather:", r);
    for (int i = 0; i < NRANKS * COUNT; i++) printf(" %g", gathered[r][i]);
    printf("   all-reduce: %g %g\n", summed[r][0], summed[r][1]);
  }

  /* Bad calls return NCCL's codes, with a message. */
  float x = 0;
  strataResult_t res = strataAllReduce(&x, &x, 1, 42 /* no such dtype */, strataSum, comms[0], NULL);
  printf("bad dtype -> %d (%s)\n  %s\n", res, strataGetErrorString(res), strataGetLastError(comms[0]));

  for (int r = 0; r < NRANKS; r++) CHECK(strataCommDestroy(comms[r]));
  res = strataCommCount(comms[0], &version);
  printf("after destroy -> %d (%s)\n  %s\n", res, strataGetErrorString(res), strataGetLastError(comms[0]));
  return 0;
}
