/*
 * The checks of the C programs that drive strata's C ABI (tests/c/test_strata.c,
 * scripts/gpu-check-capi.c, scripts/gpu-call-cost.c, scripts/gpu-driver.h): FAIL names
 * the file, line and why, and exits 1; CHECK(cond, ...) and OK(call) fail or count a
 * pass with CHECK_PASSED(), which a program that counts defines before including this
 * (default: nothing). Include after "strata.h", <stdio.h> and <stdlib.h>.
 */
#ifndef STRATA_TESTS_CHECK_H
#define STRATA_TESTS_CHECK_H

#ifndef CHECK_PASSED
#define CHECK_PASSED() ((void)0)
#endif

#define FAIL(...)                                                                  \
  do {                                                                             \
    fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                           \
    fprintf(stderr, __VA_ARGS__);                                                  \
    fprintf(stderr, "\n");                                                         \
    exit(1);                                                                       \
  } while (0)

#define CHECK(cond, ...)                                                           \
  do {                                                                             \
    if (!(cond)) FAIL(__VA_ARGS__);                                                \
    CHECK_PASSED();                                                                \
  } while (0)

/* A call that must succeed. */
#define OK(call)                                                                   \
  do {                                                                             \
    strataResult_t r_ = (call);                                                    \
    if (r_ != strataSuccess)                                                       \
      FAIL("%s -> %d (%s): %s", #call, r_, strataGetErrorString(r_),               \
           strataGetLastError(NULL));                                              \
    CHECK_PASSED();                                                                \
  } while (0)

#endif
