/* Reference-counted float buffers. Snapshots, results and gather space are recycled through a
 * free list: allocating tens of MiB per call would cost page faults every iteration. */
#include <stdlib.h>

#include "wa_internal.h"

int wai_pool_init(wa_pool *p, size_t cap, int max_free) {
  p->cap = cap;
  p->free_list = NULL;
  p->free_count = 0;
  p->max_free = max_free;
  return pthread_mutex_init(&p->mu, NULL) == 0 ? WA_OK : WA_ENOMEM;
}

wa_buf *wai_pool_get(wa_pool *p) {
  pthread_mutex_lock(&p->mu);
  wa_buf *b = p->free_list;
  if (b) {
    p->free_list = b->next;
    p->free_count--;
  }
  pthread_mutex_unlock(&p->mu);
  if (!b) {
    b = malloc(sizeof *b);
    if (!b) return NULL;
    /* 64-byte alignment keeps the reduction loops vectorised and cache-line friendly. */
    if (posix_memalign((void **)&b->data, 64, (p->cap ? p->cap : 1) * sizeof(float)) != 0) {
      free(b);
      return NULL;
    }
  }
  b->refs = 1;
  b->next = NULL;
  return b;
}

wa_buf *wai_buf_ref(wa_buf *b) {
  if (b) __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
  return b;
}

void wai_buf_unref(wa_pool *p, wa_buf *b) {
  if (!b) return;
  if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  pthread_mutex_lock(&p->mu);
  if (p->free_count < p->max_free) {
    b->next = p->free_list;
    p->free_list = b;
    p->free_count++;
    b = NULL;
  }
  pthread_mutex_unlock(&p->mu);
  if (b) {
    free(b->data);
    free(b);
  }
}

void wai_pool_destroy(wa_pool *p) {
  wa_buf *b = p->free_list;
  while (b) {
    wa_buf *next = b->next;
    free(b->data);
    free(b);
    b = next;
  }
  p->free_list = NULL;
  p->free_count = 0;
  pthread_mutex_destroy(&p->mu);
}
