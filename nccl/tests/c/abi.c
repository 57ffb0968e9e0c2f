/* Calls the fake NCCL's functions (fake_nccl.c) through libstrata_nccl.so's forwarding
 * trampolines; argv[1] picks the one called first, which goes through the lazy
 * resolution. Exits 0 when every value came back as the fake computes it. */
#include <stdio.h>
#include <string.h>

typedef struct { int nRanks, rank, stride; } team_t;
typedef struct { long a[8]; } big_t;
team_t ncclTeamWorld(long c);
big_t ncclCommMemStats(long x, double y);
long ncclPutSignal(long, long, long, long, long, long, long, long, long, long, long);
double ncclGetPeerDevicePointer(double, double, double, double, double, double, double, double,
                                double);
double ncclSignal(int n, ...);

static int bad = 0;
#define CHECK(what, cond)                                  \
  do {                                                     \
    int ok_ = (cond);                                      \
    printf("%s: %s\n", what, ok_ ? "ok" : "WRONG");        \
    bad |= !ok_;                                           \
  } while (0)

static void team(void) {
  team_t t = ncclTeamWorld(40);
  CHECK("struct in rax:rdx", t.nRanks == 40 && t.rank == 41 && t.stride == 42);
}
static void big(void) {
  big_t b = ncclCommMemStats(3, 0.5);
  int ok = 1;
  for (int i = 0; i < 8; i++) ok &= b.a[i] == 3 * i + 5;
  CHECK("struct through a hidden pointer", ok);
}
static void stack(void) {
  long r = ncclPutSignal(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11);
  CHECK("11 integer arguments (5 on the stack)", r == 506);
}
static void xmm(void) {
  double r = ncclGetPeerDevicePointer(1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5);
  CHECK("9 doubles (xmm0-7 and the stack)", r == 307.5);
}
static void varargs(void) {
  double r = ncclSignal(3, 0.25, 0.5, 0.75);
  CHECK("varargs doubles (rax)", r == 3.5);
}

int main(int argc, char **argv) {
  const char *first = argc > 1 ? argv[1] : "team";
  void (*all[])(void) = {team, big, stack, xmm, varargs};
  const char *names[] = {"team", "big", "stack", "xmm", "varargs"};
  for (int i = 0; i < 5; i++)
    if (strcmp(first, names[i]) == 0) all[i]();
  for (int i = 0; i < 5; i++) all[i]();
  return bad;
}
