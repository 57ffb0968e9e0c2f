/* Linked with -lnccl (DT_NEEDED libnccl.so.2, found through its rpath, as PyTorch's
 * libtorch_cuda.so finds the wheel's): prints which file ncclGetVersion (served) and
 * ncclParamGetParameter (forwarded) live in, read from /proc/self/maps (maps.h), and
 * what the forwarded call returns. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int ncclGetVersion(int *version);
int ncclParamGetParameter(const char *key, const char **value, int *valueLen);

#include "maps.h"

int main(void) {
  char buf[4096];
  int v = 0;
  int r = ncclGetVersion(&v);
  printf("ncclGetVersion = %d, %d\n", r, v);
  printf("ncclGetVersion in: %s\n", mapping(dlsym(RTLD_DEFAULT, "ncclGetVersion"), buf, sizeof buf));
  const char *s = NULL;
  int len = -1;
  r = ncclParamGetParameter("NCCL_DEBUG", &s, &len);
  printf("ncclParamGetParameter(NCCL_DEBUG) = %d, %s\n", r, s ? s : "(null)");
  /* The real library, loaded by libstrata_nccl.so (RTLD_LOCAL: not in dlsym's scope). */
  FILE *m = fopen("/proc/self/maps", "r");
  char line[4096];
  const char *mapped = "(none)";
  while (m && fgets(line, sizeof line, m)) {
    char *path = strchr(line, '/');
    if (!path) continue;
    path[strcspn(path, "\n")] = 0;
    size_t n = strlen(path);
    if (n >= 13 && strcmp(path + n - 13, "/libnccl.so.2") == 0) {
      snprintf(buf, sizeof buf, "%s", path);
      mapped = buf;
      break;
    }
  }
  if (m) fclose(m);
  printf("libnccl.so.2 mapped: %s\n", mapped);
  return 0;
}
