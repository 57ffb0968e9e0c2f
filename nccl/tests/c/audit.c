/* Linked with -lnccl (DT_NEEDED libnccl.so.2, found through its rpath, as PyTorch's
 * libtorch_cuda.so finds the wheel's): prints which file ncclGetVersion (served) and
 * ncclParamGetParameter (forwarded) live in, read from /proc/self/maps (dladdr names
 * an object after the name the loader searched for, not the file an LD_AUDIT object
 * answered with), and what the forwarded call returns. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

int ncclGetVersion(int *version);
int ncclParamGetParameter(const char *key, const char **value, int *valueLen);

static const char *file_of(const void *addr, char *out, size_t n) {
  FILE *m = fopen("/proc/self/maps", "r");
  char line[4096];
  out[0] = 0;
  while (m && fgets(line, sizeof line, m)) {
    unsigned long lo, hi;
    char *path = strchr(line, '/');
    if (!path || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    path[strcspn(path, "\n")] = 0;
    if (lo <= (unsigned long)addr && (unsigned long)addr < hi) {
      snprintf(out, n, "%s", path);
      break;
    }
  }
  if (m) fclose(m);
  return out;
}

int main(void) {
  char buf[4096];
  int v = 0;
  int r = ncclGetVersion(&v);
  printf("ncclGetVersion = %d, %d\n", r, v);
  printf("ncclGetVersion in: %s\n", file_of(dlsym(RTLD_DEFAULT, "ncclGetVersion"), buf, sizeof buf));
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
