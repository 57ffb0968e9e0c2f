/* A stand-in "real NCCL" for tests/forward.rs: under forwarded names, functions whose
 * signatures exercise every way a C call passes values (a struct in rax:rdx, a large
 * struct through a hidden pointer, arguments on the stack, doubles in xmm0-7, varargs),
 * so that the trampolines and their lazy first call are shown to pass everything through
 * untouched. The signatures are this test's own (the trampolines do not know any). */
#include <stdarg.h>

typedef struct { int nRanks, rank, stride; } team_t;
typedef struct { long a[8]; } big_t;

int ncclGetVersion(int *v) { *v = 99999; return 0; }

team_t pncclTeamWorld(long c) {
  team_t t = {(int)c, (int)c + 1, (int)c + 2};
  return t;
}

big_t pncclCommMemStats(long x, double y) {
  big_t b;
  for (int i = 0; i < 8; i++) b.a[i] = x * i + (long)(y * 10);
  return b;
}

long pncclPutSignal(long a, long b, long c, long d, long e, long f, long g, long h, long i, long j,
                    long k) {
  return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i + 10 * j + 11 * k;
}

double pncclGetPeerDevicePointer(double a, double b, double c, double d, double e, double f,
                                 double g, double h, double i) {
  return a + 2 * b + 3 * c + 4 * d + 5 * e + 6 * f + 7 * g + 8 * h + 9 * i;
}

double pncclSignal(int n, ...) {
  va_list ap;
  double s = 0;
  va_start(ap, n);
  for (int i = 0; i < n; i++) s += (i + 1) * va_arg(ap, double);
  va_end(ap);
  return s;
}
