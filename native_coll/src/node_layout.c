/* The node layout of a member set: which node each member is on (nodes ordered by their lowest
 * member), its place on that node, and the grid the node-aware schedule (schedule_hier.c) walks.
 * It depends only on the member set (the ranks' nodes are fixed for an engine's life), so it is
 * computed once per distinct set and kept in the engine's small cache (wire->layouts), shared by
 * every collective of that set through a reference count, and freed with the engine. A set
 * evicted from the cache (more than WAI_LAYOUT_SLOTS distinct sets: the shuffled groups of a
 * non-power-of-two run) is computed again when it comes back. Mutex held by every caller (the
 * progress thread's poll), or the progress thread stopped. */
#include <stdlib.h>
#include <string.h>

#include "wa_internal.h"

static void layout_free(wai_layout *l) {
  free(l->members);
  free(l->node_idx);
  free(l->local_idx);
  free(l->grid);
  free(l);
}

void wai_layout_unref(wai_layout *l) {
  if (l && --l->refs == 0) layout_free(l);
}

/* l->N and l->p for the members (sorted ranks), and the grid when they are on N >= 2 nodes with
 * the same number p >= 2 on each; otherwise N = 0 (the direct schedule). -1: out of memory. */
static int compute(const int *node_of, wai_layout *l) {
  const int S = l->S;
  int *nodes = malloc(sizeof(int) * (size_t)S), *count = calloc((size_t)S, sizeof(int));
  l->node_idx = malloc(sizeof(int) * (size_t)S);
  if (!nodes || !count || !l->node_idx) {
    free(nodes);
    free(count);
    return -1;
  }
  int N = 0;
  for (int j = 0; j < S; j++) { /* members are sorted: nodes come in order of their lowest member */
    int v = node_of[l->members[j]], a = 0;
    while (a < N && nodes[a] != v) a++;
    if (a == N) nodes[N++] = v;
    l->node_idx[j] = a;
    count[a]++;
  }
  int p = count[0], balanced = N >= 2 && p >= 2;
  for (int a = 1; a < N && balanced; a++) balanced = count[a] == p;
  free(nodes);
  free(count);
  if (!balanced) return 0; /* l->N stays 0 */
  l->local_idx = malloc(sizeof(int) * (size_t)S);
  l->grid = malloc(sizeof(int) * (size_t)S);
  int *fill = calloc((size_t)N, sizeof(int));
  if (!l->local_idx || !l->grid || !fill) {
    free(fill);
    return -1;
  }
  for (int j = 0; j < S; j++) {
    int a = l->node_idx[j];
    l->local_idx[j] = fill[a]++;
    l->grid[a * p + l->local_idx[j]] = j;
  }
  free(fill);
  l->N = N;
  l->p = p;
  return 0;
}

int wai_layout_get(wai_layout_cache *cache, const int *node_of, const int *members, int S,
                   wai_layout **out, wai_err *err) {
  *out = NULL;
  for (int i = 0; i < WAI_LAYOUT_SLOTS; i++) {
    wai_layout *l = cache->slot[i];
    if (l && l->S == S && memcmp(l->members, members, sizeof(int) * (size_t)S) == 0) {
      l->refs++;
      *out = l;
      return WA_OK;
    }
  }
  wai_layout *l = calloc(1, sizeof *l);
  if (l) l->members = malloc(sizeof(int) * (size_t)S);
  if (!l || !l->members) {
    free(l);
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  }
  l->S = S;
  memcpy(l->members, members, sizeof(int) * (size_t)S);
  if (compute(node_of, l) != 0) {
    layout_free(l);
    return wai_err_set(err, WA_ENOMEM, -1, "out of memory for a collective");
  }
  cache->computed++;
  wai_layout_unref(cache->slot[cache->next]); /* round robin: the oldest set makes room */
  cache->slot[cache->next] = l;
  cache->next = (cache->next + 1) % WAI_LAYOUT_SLOTS;
  l->refs = 2; /* the cache's and the caller's */
  *out = l;
  return WA_OK;
}

void wai_layout_cache_clear(wai_layout_cache *cache) {
  for (int i = 0; i < WAI_LAYOUT_SLOTS; i++) wai_layout_unref(cache->slot[i]);
  memset(cache, 0, sizeof *cache);
}
