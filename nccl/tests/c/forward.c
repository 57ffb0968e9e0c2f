/* Calls forwarded NCCL functions that work without a GPU and prints what they return,
 * so that tests/forward.rs can compare the real libnccl.so.2 with libstrata_nccl.so in
 * front of it. Prototypes declared here (nccl.h needs CUDA's headers). Argument "lazy":
 * also print whether a libnccl.so.2 is mapped before and after the first call. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void *ncclParamHandle_t;
int ncclParamGetParameter(const char *key, const char **value, int *valueLen);
int ncclParamGetAllParameterKeys(const char ***table, int *tableLen);
int ncclParamBind(ncclParamHandle_t *out, const char *key);
int ncclParamGetStr(ncclParamHandle_t h, const char **out);
int ncclLLA2ACalcSlots(int maxElts, int maxEltSize);
void ncclResetDebugInit(void);

#include "maps.h"

int main(int argc, char **argv) {
  char buf[4096];
  int lazy = argc > 1 && strcmp(argv[1], "lazy") == 0;
  if (lazy) printf("mapped before: %s\n", mapping(NULL, buf, sizeof buf)[0] ? "yes" : "no");
  const char *v = NULL;
  int len = -1;
  int r = ncclParamGetParameter("NCCL_DEBUG", &v, &len);
  printf("ncclParamGetParameter(NCCL_DEBUG) = %d, %s, %d\n", r, v ? v : "(null)", len);
  const char **keys = NULL;
  int n = -1;
  r = ncclParamGetAllParameterKeys(&keys, &n);
  printf("ncclParamGetAllParameterKeys = %d, %d keys:", r, n);
  for (int i = 0; r == 0 && i < n; i++) printf(" %s", keys[i]);
  printf("\n");
  ncclParamHandle_t h = NULL;
  r = ncclParamBind(&h, "NCCL_DEBUG");
  printf("ncclParamBind(NCCL_DEBUG) = %d\n", r);
  if (r == 0) {
    const char *s = NULL;
    r = ncclParamGetStr(h, &s);
    printf("ncclParamGetStr = %d, %s\n", r, s ? s : "(null)");
  }
  printf("ncclLLA2ACalcSlots(1024, 8) = %d\n", ncclLLA2ACalcSlots(1024, 8));
  ncclResetDebugInit();
  printf("ncclResetDebugInit returned\n");
  if (lazy) printf("mapped after: %s\n", mapping(NULL, buf, sizeof buf)[0] ? "yes" : "no");
  printf("where: %s\n", mapping((const void *)ncclParamGetParameter, buf, sizeof buf));
  return 0;
}
