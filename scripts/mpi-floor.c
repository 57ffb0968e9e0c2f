/* The floor under strata's log-step collectives on MPI (docs/cluster.md, nodes:4x1):
 * the same steps written directly against MPI in C, timed beside MPI_Allgather in one
 * process, rows interleaved, median of the rounds, rank 0's time.
 *
 *   mpicc -O2 -o /tmp/mpi-floor scripts/mpi-floor.c
 *   scripts/cluster run /tmp/mpi-floor 16384 500 21     # total bytes, calls a round, rounds
 *
 * Rows: MPI_Allgather; recursive doubling (power-of-two rank counts) through
 * MPI_Sendrecv; Bruck's steps (strata's log-step, rotated) through MPI_Sendrecv; and
 * Bruck's steps as strata's mpi transport moves a small message (receive posted into a
 * 16 KiB landing buffer, send posted, each request polled with MPI_Test, the bytes
 * copied out, the rotated result copied into rank order; only where every step fits the
 * 16 KiB landing, as strata's small path). MPI is initialised with
 * MPI_THREAD_MULTIPLE, as strata initialises it (STRATA_FLOOR_SINGLE=1: MPI_Init). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS_MAX 201
#define LANDING (16 << 10)

static char landing[LANDING];

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void doubling(const char *s, char *r, int c, int p, int x) {
  memcpy(r + x * c, s, c);
  for (int d = 1; d < p; d *= 2) {
    int peer = x ^ d, mine = x / d * d, theirs = peer / d * d;
    MPI_Sendrecv(r + mine * c, d * c, MPI_BYTE, peer, 1, r + theirs * c, d * c, MPI_BYTE,
                 peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
}

static void unrotate(const char *rot, char *r, int c, int p, int x) {
  memcpy(r + x * c, rot, (p - x) * c);
  memcpy(r, rot + (p - x) * c, x * c);
}

static void bruck(const char *s, char *r, char *rot, int c, int p, int x) {
  memcpy(rot, s, c);
  for (int d = 1; d < p; d *= 2) {
    int m = d < p - d ? d : p - d;
    MPI_Sendrecv(rot, m * c, MPI_BYTE, (x + p - d) % p, 2, rot + d * c, m * c, MPI_BYTE,
                 (x + d) % p, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  unrotate(rot, r, c, p, x);
}

static void bruck_landing(const char *s, char *r, char *rot, int c, int p, int x) {
  memcpy(rot, s, c);
  for (int d = 1; d < p; d *= 2) {
    int m = d < p - d ? d : p - d, got = 0, sent = 0;
    MPI_Request rq, sq;
    MPI_Irecv(landing, LANDING, MPI_BYTE, (x + d) % p, 3, MPI_COMM_WORLD, &rq);
    MPI_Isend(rot, m * c, MPI_BYTE, (x + p - d) % p, 3, MPI_COMM_WORLD, &sq);
    while (!got) MPI_Test(&rq, &got, MPI_STATUS_IGNORE);
    while (!sent) MPI_Test(&sq, &sent, MPI_STATUS_IGNORE);
    memcpy(rot + d * c, landing, m * c);
  }
  unrotate(rot, r, c, p, x);
}

int main(int argc, char **argv) {
  int provided, p, x;
  if (getenv("STRATA_FLOOR_SINGLE")) MPI_Init(&argc, &argv);
  else MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &x);
  if (argc != 4) {
    if (x == 0) fprintf(stderr, "usage: mpi-floor TOTAL_BYTES CALLS ROUNDS\n");
    MPI_Finalize();
    return 2;
  }
  int total = atoi(argv[1]), calls = atoi(argv[2]), rounds = atoi(argv[3]);
  int c = total / p, pow2 = (p & (p - 1)) == 0, small = (long)(p / 2) * c <= LANDING;
  if (c <= 0 || calls <= 0 || rounds <= 0 || rounds > ROUNDS_MAX) {
    if (x == 0) fprintf(stderr, "mpi-floor: need TOTAL >= ranks, CALLS >= 1 and 1..%d ROUNDS\n", ROUNDS_MAX);
    MPI_Finalize();
    return 2;
  }
  char *s = malloc(c), *r = malloc(total), *rot = malloc(total);
  memset(s, x + 1, c);
  const char *name[4] = {"MPI_Allgather", "doubling, MPI_Sendrecv", "bruck, MPI_Sendrecv",
                         "bruck, landing + MPI_Test"};
  static double t[4][ROUNDS_MAX];
  for (int k = 0; k < rounds; k++)
    for (int a = 0; a < 4; a++) {
      if ((a == 1 && !pow2) || (a == 3 && !small)) continue;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      for (int i = 0; i < calls; i++) {
        if (a == 0) MPI_Allgather(s, c, MPI_BYTE, r, c, MPI_BYTE, MPI_COMM_WORLD);
        else if (a == 1) doubling(s, r, c, p, x);
        else if (a == 2) bruck(s, r, rot, c, p, x);
        else bruck_landing(s, r, rot, c, p, x);
      }
      t[a][k] = (MPI_Wtime() - t0) / calls * 1e6;
      for (int j = 0; j < p; j++) /* every row's result checked once a round */
        for (int b = 0; b < c; b++)
          if (r[j * c + b] != (char)(j + 1)) {
            fprintf(stderr, "mpi-floor: rank %d: %s put a wrong byte at chunk %d\n", x, name[a], j);
            MPI_Abort(MPI_COMM_WORLD, 1);
          }
    }
  if (x == 0) {
    qsort(t[0], rounds, sizeof(double), cmp);
    double base = t[0][rounds / 2];
    printf("# %d ranks, %d B all-gathered, median of %d rounds of %d calls\n", p, total, rounds, calls);
    for (int a = 0; a < 4; a++) {
      if ((a == 1 && !pow2) || (a == 3 && !small)) continue;
      if (a) qsort(t[a], rounds, sizeof(double), cmp);
      double m = t[a][rounds / 2];
      printf("%-28s %8.1f us  %.2f\n", name[a], m, m / base);
    }
  }
  free(s); free(r); free(rot);
  MPI_Finalize();
  return 0;
}
