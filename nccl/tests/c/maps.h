/* The tests' look into /proc/self/maps (dladdr names an object after the name the loader
 * searched for, not the file an LD_AUDIT object answered with). */
#ifndef STRATA_NCCL_TEST_MAPS_H
#define STRATA_NCCL_TEST_MAPS_H
#include <stdio.h>
#include <string.h>

/* The file mapped at `addr`, or "" ("mapped" when addr is NULL: any libnccl.so.2). */
static const char *mapping(const void *addr, char *out, size_t n) {
  FILE *m = fopen("/proc/self/maps", "r");
  char line[4096];
  out[0] = 0;
  while (m && fgets(line, sizeof line, m)) {
    unsigned long lo, hi;
    char *path = strchr(line, '/');
    if (!path || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
    path[strcspn(path, "\n")] = 0;
    if (addr ? (lo <= (unsigned long)addr && (unsigned long)addr < hi)
             : (strlen(path) >= 13 && strcmp(path + strlen(path) - 13, "/libnccl.so.2") == 0)) {
      snprintf(out, n, "%s", path);
      break;
    }
  }
  if (m) fclose(m);
  return out;
}

#endif
