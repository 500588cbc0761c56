/* The exit report: when MPI aborts this process from inside a call (MPICH treats a peer's broken
 * connection as fatal whatever the error handler: a killed node ends every survivor within a fraction
 * of a second), no exception ever reaches the application. An atexit hook then calls every
 * registered entry's report callback (the engine's names, for each collective in flight, the ranks
 * that had not delivered their part), so the user learns which node was lost. Nothing here makes an
 * MPI call or takes a lock the exiting thread may hold (it is often the progress thread itself,
 * inside MPI_Testsome with the engine's mutex held): the callbacks read the engine's state as it
 * stands, which only the exiting process can still change. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "wa_internal.h"

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static wai_exit_entry *live; /* entries of engines created and not yet destroyed */
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

static void report(void) {
  if (pthread_mutex_trylock(&live_mu) != 0) return;
  for (wai_exit_entry *x = live; x; x = x->next) x->report(x->ctx);
  pthread_mutex_unlock(&live_mu);
}

/* One write(2) of the whole line: the ranks of a node share their stderr pipe, and unbuffered stdio
 * would emit each piece as its own write, so two survivors' reports interleaved mid-line. A write of
 * up to PIPE_BUF bytes to a pipe is atomic; a longer list of missing ranks is cut to fit. */
#define LINE_MAX_BYTES 4096

typedef struct {
  char buf[LINE_MAX_BYTES];
  size_t len;
  int cut;
} line_buf;

#define END_BYTES 200 /* kept back for the line's end */

/* Appends unless that would leave fewer than `keep` bytes free; then the line is cut there. */
static void put(line_buf *b, size_t keep, const char *fmt, ...) {
  if (b->cut) return;
  size_t room = sizeof b->buf - b->len;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(b->buf + b->len, room, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n + keep >= room)
    b->cut = 1;
  else
    b->len += (size_t)n;
}

void wai_exit_report_line(int rank, const char *const *where, const char *what,
                          const int *missing, int n_missing) {
  line_buf b = {.len = 0, .cut = 0};
  put(&b, END_BYTES, "native_coll: rank %d%s%s%s is exiting inside MPI while %s was in flight; "
      "rank(s) [", rank, where ? " (" : "", where ? where[rank] : "", where ? ")" : "", what);
  for (int i = 0; i < n_missing; i++) put(&b, END_BYTES, "%s%d", i ? ", " : "", missing[i]);
  put(&b, END_BYTES, "] had not delivered their part"); /* (put does nothing once cut) */
  for (int i = 0; where && i < n_missing; i++) /* the collective's own "rank R (host, pid)" */
    put(&b, END_BYTES, "%srank %d (%s)", i ? ", " : ": ", missing[i], where[missing[i]]);
  int cut = b.cut;
  b.cut = 0;
  put(&b, 0, "%s; a lost node, a killed process or a broken link; restart from the last checkpoint\n",
      cut ? " ... (more)" : "");
  fflush(stderr);
  for (size_t off = 0; off < b.len;) {
    ssize_t n = write(STDERR_FILENO, b.buf + off, b.len - off);
    if (n <= 0) break;
    off += (size_t)n;
  }
}

static void install_hook(void) { atexit(report); }

void wai_exit_report_register(wai_exit_entry *entry) {
  pthread_once(&hook_once, install_hook);
  pthread_mutex_lock(&live_mu);
  entry->next = live;
  live = entry;
  pthread_mutex_unlock(&live_mu);
}

void wai_exit_report_unregister(wai_exit_entry *entry) {
  pthread_mutex_lock(&live_mu);
  for (wai_exit_entry **p = &live; *p; p = &(*p)->next)
    if (*p == entry) {
      *p = entry->next;
      break;
    }
  pthread_mutex_unlock(&live_mu);
}
