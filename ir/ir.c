/* ir/ir.c: arena, diagnostics, dtypes, shapes, the op table, the graph, the
 * shape rules, the verifier and the text printer (the parser is ir_parse.c,
 * Graphviz and JSON are ir_export.c). */
#include "ir.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- arena */

typedef struct Chunk {
  struct Chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
  Chunk *head;
  size_t chunk;
};

_Noreturn void duet_fatal(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "duet: internal error at %s:%d: ", file, line);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  abort();
}

Arena *arena_new(size_t chunk_bytes) {
  Arena *a = calloc(1, sizeof *a);
  if (!a) duet_fatal(__FILE__, __LINE__, "out of host memory");
  a->chunk = chunk_bytes ? chunk_bytes : (1u << 20);
  return a;
}

void *arena_alloc(Arena *a, size_t bytes) {
  bytes = (bytes + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < bytes) {
    size_t cap = bytes > a->chunk ? bytes : a->chunk;
    Chunk *c = malloc(sizeof *c + cap);
    if (!c) duet_fatal(__FILE__, __LINE__, "out of host memory (%zu bytes)", cap);
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += bytes;
  memset(p, 0, bytes);
  return p;
}

char *arena_strdup(Arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = arena_alloc(a, n);
  memcpy(p, s, n);
  return p;
}

char *arena_printf(Arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  DUET_ASSERT(n >= 0);
  char *p = arena_alloc(a, (size_t)n + 1);
  vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

void arena_free(Arena *a) {
  if (!a) return;
  for (Chunk *c = a->head, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  free(a);
}

/* ------------------------------------------------------------ name maps */

static uint64_t name_hash(const char *s) {
  uint64_t h = 14695981039346656037u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211u;
  return h;
}

void **namemap_slot(Arena *a, NameMap *m, const char *key) {
  if (2 * (m->used + 1) > m->cap) { /* at most half full */
    size_t cap = m->cap ? 2 * m->cap : 8; /* small: a block call's scope holds a few names */
    const char **k = arena_alloc(a, cap * sizeof *k);
    void **v = arena_alloc(a, cap * sizeof *v);
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->key[i]) continue;
      size_t j = name_hash(m->key[i]) & (cap - 1);
      while (k[j]) j = (j + 1) & (cap - 1);
      k[j] = m->key[i];
      v[j] = m->val[i];
    }
    m->key = k;
    m->val = v;
    m->cap = cap;
  }
  size_t j = name_hash(key) & (m->cap - 1);
  while (m->key[j] && strcmp(m->key[j], key)) j = (j + 1) & (m->cap - 1);
  if (!m->key[j]) {
    m->key[j] = key;
    m->used++;
  }
  return &m->val[j];
}

void *namemap_get(const NameMap *m, const char *key) {
  if (!m->cap) return NULL;
  size_t j = name_hash(key) & (m->cap - 1);
  while (m->key[j] && strcmp(m->key[j], key)) j = (j + 1) & (m->cap - 1);
  return m->key[j] ? m->val[j] : NULL;
}

/* ----------------------------------------------------- byte range sets */

struct RangeNode {
  int64_t off, size;
  int64_t gap;     /* free bytes before this range: off less the end of the previous range (0 for the first) */
  int64_t max_gap; /* the largest gap in this subtree */
  uint64_t prio;
  int tag;
  RangeNode *l, *r;
};

static void range_pull(RangeNode *t) {
  t->max_gap = t->gap;
  if (t->l && t->l->max_gap > t->max_gap) t->max_gap = t->l->max_gap;
  if (t->r && t->r->max_gap > t->max_gap) t->max_gap = t->r->max_gap;
}

/* t split into the ranges starting below `key` (*lo) and the others (*hi). */
static void range_split(RangeNode *t, int64_t key, RangeNode **lo, RangeNode **hi) {
  if (!t) {
    *lo = *hi = NULL;
  } else if (t->off < key) {
    range_split(t->r, key, &t->r, hi);
    range_pull(t);
    *lo = t;
  } else {
    range_split(t->l, key, lo, &t->l);
    range_pull(t);
    *hi = t;
  }
}

/* Every range of a before every range of b. */
static RangeNode *range_merge(RangeNode *a, RangeNode *b) {
  if (!a) return b;
  if (!b) return a;
  if (a->prio > b->prio) {
    a->r = range_merge(a->r, b);
    range_pull(a);
    return a;
  }
  b->l = range_merge(a, b->l);
  range_pull(b);
  return b;
}

static int64_t range_end_of_last(const RangeNode *t) {
  if (!t) return 0;
  while (t->r) t = t->r;
  return t->off + t->size;
}

/* Sets the gap of the first range of t after a range ending at
 * `end_before` (0: none); returns that gap. */
static int64_t range_set_first_gap(RangeNode *t, int64_t end_before) {
  int64_t gap;
  if (t->l) gap = range_set_first_gap(t->l, end_before);
  else gap = t->gap = t->off - end_before;
  range_pull(t);
  return gap;
}

void rangeset_insert(RangeSet *s, int64_t off, int64_t size, int tag) {
  DUET_ASSERT(off >= 0 && size >= 1 && off <= INT64_MAX - size);
  RangeNode *lo, *hi, *n = s->spare;
  if (n) s->spare = n->l;
  else n = arena_alloc(s->arena, sizeof *n);
  s->rng += 0x9E3779B97F4A7C15u; /* splitmix64 */
  uint64_t z = s->rng;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  *n = (RangeNode){.off = off, .size = size, .prio = z ^ (z >> 31), .tag = tag};
  range_split(s->root, off, &lo, &hi);
  n->gap = off - range_end_of_last(lo);
  DUET_ASSERT(n->gap >= 0);
  range_pull(n);
  if (hi) {
    int64_t next_gap = range_set_first_gap(hi, off + size);
    DUET_ASSERT(next_gap >= 0);
  }
  s->root = range_merge(range_merge(lo, n), hi);
}

void rangeset_remove(RangeSet *s, int64_t off) {
  RangeNode *lo, *mid, *hi;
  range_split(s->root, off, &lo, &hi);
  range_split(hi, off == INT64_MAX ? off : off + 1, &mid, &hi);
  DUET_ASSERT(mid && mid->off == off && !mid->l && !mid->r);
  if (hi) range_set_first_gap(hi, range_end_of_last(lo));
  mid->l = s->spare;
  s->spare = mid;
  s->root = range_merge(lo, hi);
}

int rangeset_overlap(const RangeSet *s, int64_t off, int64_t size, int64_t *o_off, int64_t *o_size) {
  /* the ranges are disjoint and sorted, so the last one starting before
   * off + size ends last among those: it overlaps if any does */
  const RangeNode *best = NULL;
  for (const RangeNode *t = s->root; t;) {
    if (t->off < off + size) best = t, t = t->r;
    else t = t->l;
  }
  if (!best || best->off + best->size <= off) return -1;
  *o_off = best->off;
  *o_size = best->size;
  return best->tag;
}

int64_t rangeset_first_fit(const RangeSet *s, int64_t size) {
  for (const RangeNode *t = s->root; t;) {
    if (t->l && t->l->max_gap >= size) t = t->l;
    else if (t->gap >= size) return t->off - t->gap;
    else t = t->r;
  }
  return range_end_of_last(s->root);
}

/* ---------------------------------------------------------- diagnostics */

/* Lines end at "\n", "\r\n" or a lone "\r", as in the lexer. */
static const char *line_start(const Source *s, int line, size_t *len) {
  const char *p = s->text, *end = s->text + s->len;
  for (int l = 1; l < line && p < end; p++)
    if (*p == '\n' || (*p == '\r' && (p + 1 == end || p[1] != '\n'))) l++;
  const char *q = p;
  while (q < end && *q != '\n' && *q != '\r') q++;
  *len = (size_t)(q - p);
  return p;
}

int ir_edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 64 || m > 64) return 99;
  int d[65][65];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
        v = d[i - 2][j - 2] + 1;
      d[i][j] = v;
    }
  return d[n][m];
}

int source_char_col(const Source *s, int line, int col) {
  if (!s || !s->text) return col;
  size_t len;
  const char *p = line_start(s, line, &len);
  int chars = 1;
  for (int i = 0; i < col - 1 && (size_t)i < len; i++)
    if (((unsigned char)p[i] & 0xC0) != 0x80) chars++;
  /* a column past the end of the line counts one character per byte */
  if ((size_t)(col - 1) > len) chars += col - 1 - (int)len;
  return chars;
}

/* Terminal columns taken by the UTF-8 character at p (n bytes left): 2 for
 * East Asian wide characters and emoji, 0 for combining marks, else 1 (after
 * Markus Kuhn's wcwidth; the C library's needs a UTF-8 locale). */
static int utf8_width(const char *p, size_t n) {
  const unsigned char *u = (const unsigned char *)p;
  int len = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
  if ((size_t)len > n) return 1;
  uint32_t c = len == 1 ? u[0] : (uint32_t)u[0] & (0x7Fu >> len);
  for (int k = 1; k < len; k++) {
    if ((u[k] & 0xC0) != 0x80) return 1;
    c = c << 6 | (u[k] & 0x3Fu);
  }
  if ((c >= 0x300 && c <= 0x36F) || (c >= 0x200B && c <= 0x200F) || (c >= 0xFE00 && c <= 0xFE0F) ||
      (c >= 0x20D0 && c <= 0x20FF))
    return 0;
  if ((c >= 0x1100 && c <= 0x115F) || c == 0x2329 || c == 0x232A ||
      (c >= 0x2E80 && c <= 0xA4CF && c != 0x303F) || (c >= 0xAC00 && c <= 0xD7A3) ||
      (c >= 0xF900 && c <= 0xFAFF) || (c >= 0xFE10 && c <= 0xFE19) || (c >= 0xFE30 && c <= 0xFE6F) ||
      (c >= 0xFF00 && c <= 0xFF60) || (c >= 0xFFE0 && c <= 0xFFE6) || (c >= 0x1F300 && c <= 0x1F64F) ||
      (c >= 0x1F680 && c <= 0x1F6FF) || (c >= 0x1F900 && c <= 0x1F9FF) ||
      (c >= 0x20000 && c <= 0x3FFFD))
    return 2;
  return 1;
}

void diag_vreport(Diag *d, Loc loc, const char *kind, const char *fmt, va_list ap) {
  FILE *out = d->out ? d->out : stderr;
  if (loc.src && loc.line < 1)
    fprintf(out, "%s: %s: ", loc.src->name, kind);
  else if (loc.src)
    fprintf(out, "%s:%d:%d: %s: ", loc.src->name, loc.line,
            source_char_col(loc.src, loc.line, loc.col), kind);
  else
    fprintf(out, "duet: %s: ", kind);
  vfprintf(out, fmt, ap);
  fputc('\n', out);
  if (!loc.src || !loc.src->text || loc.line < 1) return;
  size_t len;
  const char *p = line_start(loc.src, loc.line, &len);
  const size_t max_show = 200;
  size_t from = 0;
  /* very long lines: show a window around the column */
  if (len > max_show && (size_t)loc.col > max_show / 2) from = (size_t)loc.col - max_show / 2;
  while (from > 0 && from < len && ((unsigned char)p[from] & 0xC0) == 0x80) from--;
  size_t to = len - from > max_show ? from + max_show : len;
  fprintf(out, "  %s", from ? "..." : "");
  for (size_t i = from; i < to; i++) { /* control characters would drive the terminal */
    unsigned char c = (unsigned char)p[i];
    fputc(c == '\t' || (c >= 0x20 && c != 0x7F) ? c : '?', out);
  }
  fprintf(out, "%s\n  %s", to < len ? "..." : "", from ? "   " : "");
  for (size_t i = from; i < (size_t)(loc.col - 1) && i < to; i++) {
    unsigned char c = (unsigned char)p[i];
    if ((c & 0xC0) == 0x80) continue; /* UTF-8 continuation: no column */
    if (c == '\t') fputc('\t', out);
    else for (int w = c < 0x80 ? 1 : utf8_width(p + i, to - i); w > 0; w--) fputc(' ', out);
  }
  fputs("^\n", out);
}

void diag_error(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, loc, "error", fmt, ap);
  va_end(ap);
  d->n_errors++;
  if (d->jmp) longjmp(*d->jmp, 1);
}

void diag_warning(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, loc, "warning", fmt, ap);
  va_end(ap);
  d->n_warnings++;
}

void diag_note(Diag *d, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(d, loc, "note", fmt, ap);
  va_end(ap);
}

void diag_error_noloc(Diag *d, const char *fmt, ...) {
  va_list ap;
  Loc none = {0};
  va_start(ap, fmt);
  diag_vreport(d, none, "error", fmt, ap);
  va_end(ap);
  d->n_errors++;
  if (d->jmp) longjmp(*d->jmp, 1);
}

/* -------------------------------------------------------- types, shapes */

static const char *const dtype_names[DT_COUNT] = {"void", "f32", "f64", "i32", "f16", "bf16", "u8", "i8"};
static const size_t dtype_sizes[DT_COUNT] = {0, 4, 8, 4, 2, 2, 1, 1};

const char *dtype_name(DType t) { return (unsigned)t < DT_COUNT ? dtype_names[t] : "?"; }
size_t dtype_size(DType t) { return (unsigned)t < DT_COUNT ? dtype_sizes[t] : 0; }

int64_t ir_kv_heads(const Attr *a) { return a->kv_heads > 0 ? a->kv_heads : a->heads; }

int64_t ir_workspace_elems(const Value *v) {
  if (v->op != OP_ATTENTION_GRAD || v->n_in < 2 || v->in[1]->shape.rank != 3) return 0;
  const Shape *q = &v->in[1]->shape; /* [batch, time, cols] */
  return 3 * q->dim[0] * q->dim[1] * v->attr.heads;
}
bool dtype_is_float(DType t) { return t == DT_F32 || t == DT_F64 || t == DT_F16 || t == DT_BF16; }
int dtype_from_name(const char *name) {
  for (int i = 1; i < DT_COUNT; i++)
    if (!strcmp(name, dtype_names[i])) return i;
  return -1;
}

int64_t shape_numel(const Shape *s) {
  int64_t n = 1;
  for (int i = 0; i < s->rank; i++) {
    if (s->dim[i] < 0) return -1;
    if (s->dim[i] && n > INT64_MAX / s->dim[i]) return -1;
    n *= s->dim[i];
  }
  return n;
}

bool shape_eq(const Shape *a, const Shape *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->dim[i] != b->dim[i]) return false;
  return true;
}

char *shape_str(const Shape *s, char *buf, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, n - k, "[");
  for (int i = 0; i < s->rank && k < n; i++)
    k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? "," : "", s->dim[i]);
  if (k < n) snprintf(buf + k, n - k, "]");
  return buf;
}

bool shape_broadcast(const Shape *a, const Shape *b, Shape *out) {
  int r = a->rank > b->rank ? a->rank : b->rank;
  Shape o = {.rank = r};
  for (int i = 0; i < r; i++) {
    int ia = a->rank - r + i, ib = b->rank - r + i;
    int64_t da = ia >= 0 ? a->dim[ia] : 1, db = ib >= 0 ? b->dim[ib] : 1;
    if (da != db && da != 1 && db != 1) return false;
    o.dim[i] = da == 1 ? db : da;
  }
  *out = o;
  return true;
}

/* ------------------------------------------------------------------ ops */

const OpInfo op_info[OP_COUNT] = {
#define EW OPF_EW
#define SIDE OPF_SIDE
#define OP(id, name, n, rule, flags, surface, prec, kop) {name, n, rule, flags, surface, PREC_##prec},
#include "ops.def"
#undef OP
#undef EW
#undef SIDE
};

int op_from_name(const char *name) {
  for (int i = 0; i < OP_COUNT; i++)
    if (!strcmp(op_info[i].name, name)) return i;
  return -1;
}

static const char *const init_names[INIT_COUNT] = {
    "zeros", "ones", "normal", "uniform", "kaiming_uniform", "xavier_uniform"};
const char *init_name(InitKind k) { return (unsigned)k < INIT_COUNT ? init_names[k] : "?"; }

bool train_offload(const TrainSpec *t) { return t->offload && !strcmp(t->offload, "optimizer"); }

void train_spec_defaults(TrainSpec *t) {
  memset(t, 0, sizeof *t);
  t->data = DATA_NONE;
  t->optimizer = OPTIM_ADAMW;
  t->lr = 1e-3;
  t->weight_decay = 0.01;
  t->beta1 = 0.9;
  t->beta2 = 0.999;
  t->eps = 1e-8;
  t->momentum = 0.0;
  t->batch = 32;
  t->epochs = 1;
  t->steps = 0;
  t->seed = 1;
  t->log_every = 50;
  t->eval = true;
  t->eval_every = 0;
  t->eval_batches = 20;
  t->micro_batches = 1;
}

int prune_mode_parse(const char *s, PruneMode *mode, int *n, int *m) {
  static const char *const names[] = {"unstructured", "global", "channels"};
  static const PruneMode modes[] = {PRUNE_UNSTRUCTURED, PRUNE_GLOBAL, PRUNE_CHANNELS};
  for (int i = 0; i < 3; i++)
    if (!strcmp(s, names[i])) {
      *mode = modes[i];
      *n = *m = 0;
      return 0;
    }
  int a = 0, b = 0, k = 0;
  const char *q = s;
  while (*q >= '0' && *q <= '9' && k++ < 3) a = 10 * a + (*q++ - '0');
  if (k == 0 || *q++ != ':') return -1;
  k = 0;
  while (*q >= '0' && *q <= '9' && k++ < 3) b = 10 * b + (*q++ - '0');
  if (k == 0 || *q || a < 1 || a >= b || b > 64) return -1;
  *mode = PRUNE_NM;
  *n = a;
  *m = b;
  return 0;
}

char *prune_mode_str(const PruneSpec *p, char *buf, size_t len) {
  switch (p->mode) {
  case PRUNE_UNSTRUCTURED: snprintf(buf, len, "unstructured"); break;
  case PRUNE_GLOBAL: snprintf(buf, len, "global"); break;
  case PRUNE_CHANNELS: snprintf(buf, len, "channels"); break;
  case PRUNE_NM: snprintf(buf, len, "%d:%d", p->nm_n, p->nm_m); break;
  default: snprintf(buf, len, "none"); break;
  }
  return buf;
}

int prune_spec_resolve(PruneSpec *p, char *err, size_t errlen) {
  char m[32];
  prune_mode_str(p, m, sizeof m);
  if (!(p->set & PRUNE_SET_START)) p->start = 0;
  if (!(p->set & PRUNE_SET_END)) p->end = p->start;
  if (!(p->set & PRUNE_SET_EVERY)) p->every = PRUNE_DEFAULT_EVERY;
  if (!(p->set & PRUNE_SET_INITIAL)) p->initial = 0;
  if (p->mode == PRUNE_NM) {
    double s = (double)(p->nm_m - p->nm_n) / (double)p->nm_m;
    if ((p->set & PRUNE_SET_SPARSITY) && p->sparsity != s) {
      snprintf(err, errlen, "%s pruning keeps %d of every %d weights (sparsity %s); the sparsity %s does not match it "
               "(leave the sparsity out)", m, p->nm_n, p->nm_m, ir_num_str(s, (char[32]){0}, 32),
               ir_num_str(p->sparsity, (char[32]){0}, 32));
      return -1;
    }
    p->sparsity = s;
    if ((p->set & (PRUNE_SET_END | PRUNE_SET_EVERY | PRUNE_SET_INITIAL)) && p->end != p->start) {
      snprintf(err, errlen, "%s pruning is one-shot, at its start step: the end step and the frequency belong to the "
               "gradual schedule of unstructured, global and channels pruning", m);
      return -1;
    }
  } else if (!(p->set & PRUNE_SET_SPARSITY)) {
    snprintf(err, errlen, "%s pruning needs its final sparsity: `sparsity = S` in the prune section, or --prune S", m);
    return -1;
  }
  if (!(p->sparsity >= 0 && p->sparsity < 1)) {
    snprintf(err, errlen, "prune sparsity must be in [0, 1), got %s", ir_num_str(p->sparsity, (char[32]){0}, 32));
    return -1;
  }
  if (!(p->initial >= 0 && p->initial <= p->sparsity)) {
    snprintf(err, errlen, "prune initial sparsity %s must be in [0, %s] (at most the final sparsity)",
             ir_num_str(p->initial, (char[32]){0}, 32), ir_num_str(p->sparsity, (char[32]){0}, 32));
    return -1;
  }
  if (p->start < 0 || p->every < 1) {
    snprintf(err, errlen, p->start < 0 ? "prune start step must be >= 0, got %" PRId64 : "prune frequency (every) must "
             "be >= 1 step, got %" PRId64, p->start < 0 ? p->start : p->every);
    return -1;
  }
  if (p->end < p->start) {
    snprintf(err, errlen, "prune end step %" PRId64 " is before its start step %" PRId64, p->end, p->start);
    return -1;
  }
  p->set = PRUNE_SET_SPARSITY | PRUNE_SET_MODE | PRUNE_SET_START | PRUNE_SET_END | PRUNE_SET_EVERY | PRUNE_SET_INITIAL |
           (p->params ? PRUNE_SET_PARAMS : 0);
  return 0;
}

/* ---------------------------------------------------------------- graph */

Graph *graph_new(Arena *a, Diag *d) {
  Graph *g = arena_alloc(a, sizeof *g);
  g->arena = a;
  g->diag = d;
  g->float_dtype = DT_F32;
  train_spec_defaults(&g->train);
  return g;
}

static void graph_push(Graph *g, Value *v) {
  if (g->n_values == g->cap_values) {
    int cap = g->cap_values ? 2 * g->cap_values : 64;
    Value **nv = arena_alloc(g->arena, (size_t)cap * sizeof *nv);
    if (g->n_values) memcpy(nv, g->values, (size_t)g->n_values * sizeof *nv);
    g->values = nv;
    g->cap_values = cap;
  }
  v->id = g->n_values;
  g->values[g->n_values++] = v;
}

/* Blocks, repeat and split expand inline: a few lines can ask for 2^100
 * values.  The largest real models have tens of thousands. */

Value *graph_add(Graph *g, OpKind op, Value **in, int n_in, const Attr *attr, Loc loc) {
  DUET_ASSERT(op >= 0 && op < OP_COUNT);
  DUET_ASSERT(op_info[op].arity < 0 || op_info[op].arity == n_in);
  if (g->n_values >= GRAPH_MAX_VALUES)
    diag_error(g->diag, loc, "the model has more than %d values (blocks, repeat and split are expanded inline)",
               GRAPH_MAX_VALUES);
  Value *v = arena_alloc(g->arena, sizeof *v);
  v->op = op;
  v->n_in = n_in;
  v->in = arena_alloc(g->arena, (size_t)(n_in ? n_in : 1) * sizeof *v->in);
  for (int i = 0; i < n_in; i++) v->in[i] = in[i];
  if (attr) v->attr = *attr;
  v->loc = loc;
  v->device = -1;
  ir_infer_shape(g, v);
  graph_push(g, v);
  return v;
}

void graph_renumber(Graph *g) {
  for (int i = 0; i < g->n_values; i++) g->values[i]->id = i;
}

bool ir_param_transfer(const Value *v) {
  return v->op == OP_TRANSFER && v->n_in == 1 && v->in[0]->op == OP_PARAM && v->role == ROLE_FORWARD;
}

bool ir_tied_add(const Value *v) { return v->op == OP_ADD && v->role == ROLE_OPTIMIZER; }

const Value *ir_tied_part(const Value *x) {
  return x && x->op == OP_TRANSFER && x->role == ROLE_OPTIMIZER && x->n_in == 1 ? x->in[0] : x;
}

bool graph_is_eval_program(const Graph *g) {
  bool params = false;
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->role == ROLE_BACKWARD || v->role == ROLE_OPTIMIZER) return false;
    params |= v->op == OP_PARAM;
  }
  return g->loss && params && !g->decode;
}

void graph_count_uses(Graph *g) {
  for (int i = 0; i < g->n_values; i++) g->values[i]->n_uses = 0;
  for (int i = 0; i < g->n_values; i++)
    for (int j = 0; j < g->values[i]->n_in; j++) g->values[i]->in[j]->n_uses++;
}

/* ---------------------------------------------------------- shape rules */

#define SHP(s, b) shape_str((s), (b), sizeof(b))

static void need_float(Graph *g, Value *v, int i) {
  Value *x = v->in[i];
  if (!dtype_is_float(x->dtype))
    diag_error(g->diag, v->loc,
               "%s expects a float tensor as operand %d, got %s (integer inputs "
               "cannot flow into differentiable ops)",
               op_info[v->op].name, i + 1, dtype_name(x->dtype));
}

static void need_same_dtype(Graph *g, Value *v) {
  for (int i = 1; i < v->n_in; i++)
    if (v->in[i]->dtype != v->in[0]->dtype)
      diag_error(g->diag, v->loc, "%s of %s and %s: operand dtypes differ", op_info[v->op].name,
                 dtype_name(v->in[0]->dtype), dtype_name(v->in[i]->dtype));
}

static void check_numel(Graph *g, Value *v) {
  for (int i = 0; i < v->shape.rank; i++)
    if (v->shape.dim[i] < 1) {
      char b[160];
      diag_error(g->diag, v->loc, "dimension %d of %s is %" PRId64 ": dimensions must be at least 1",
                 i, SHP(&v->shape, b), v->shape.dim[i]);
    }
  int64_t n = shape_numel(&v->shape);
  if (n < 0) {
    char b[160];
    diag_error(g->diag, v->loc, "shape %s has more elements than fit in 64 bits",
               SHP(&v->shape, b));
  }
  if (dtype_size(v->dtype) && n > INT64_MAX / (int64_t)dtype_size(v->dtype)) {
    char b[160];
    diag_error(g->diag, v->loc, "shape %s of %s is too large: its size in bytes overflows 64 bits",
               SHP(&v->shape, b), dtype_name(v->dtype));
  }
}

void ir_infer_shape(Graph *g, Value *v) {
  char b1[160], b2[160];
  Shape s = {0};
  switch (op_info[v->op].rule) {
  case SHAPE_ATTR:
    s = v->attr.shape;
    if (v->op == OP_BROADCAST || v->op == OP_SUM_TO || v->op == OP_MAX_TO) {
      Shape o;
      const Shape *big = v->op == OP_BROADCAST ? &s : &v->in[0]->shape;
      const Shape *small = v->op == OP_BROADCAST ? &v->in[0]->shape : &s;
      if (!shape_broadcast(big, small, &o) || !shape_eq(&o, big))
        diag_error(g->diag, v->loc, "%s of %s to %s: shapes do not broadcast",
                   op_info[v->op].name, SHP(&v->in[0]->shape, b1), SHP(&s, b2));
      v->dtype = v->in[0]->dtype;
    } else {
      v->dtype = v->attr.dtype;
    }
    break;
  case SHAPE_VIEW:
    s = v->attr.shape;
    for (int i = 0; i < v->n_in; i++) need_float(g, v, i);
    need_same_dtype(g, v);
    v->dtype = v->in[0]->dtype;
    if (v->op == OP_RESHAPE && shape_numel(&v->in[0]->shape) != shape_numel(&s))
      diag_error(g->diag, v->loc, "reshape of %s to %s: element counts differ", SHP(&v->in[0]->shape, b1),
                 SHP(&s, b2));
    break;
  case SHAPE_SCALAR:
    if (v->op == OP_CONST || v->op == OP_LOSS_SCALE) {
      v->dtype = v->attr.dtype ? v->attr.dtype : g->float_dtype;
    } else if (v->op == OP_MEAN) {
      need_float(g, v, 0);
      v->dtype = v->in[0]->dtype;
    } else if (v->op == OP_MSE_LOSS) { /* pred, target: float, one shape */
      need_float(g, v, 0);
      need_float(g, v, 1);
      need_same_dtype(g, v);
      if (!shape_eq(&v->in[0]->shape, &v->in[1]->shape))
        diag_error(g->diag, v->loc, "mse_loss of %s and target %s: shapes differ", SHP(&v->in[0]->shape, b1),
                   SHP(&v->in[1]->shape, b2));
      v->dtype = v->in[0]->dtype;
    } else { /* CROSS_ENTROPY: logits [..., C], labels i32 [...] */
      Value *lg = v->in[0], *lb = v->in[1];
      need_float(g, v, 0);
      if (lg->shape.rank < 2)
        diag_error(g->diag, v->loc, "cross_entropy expects logits of rank 2 or more [..., C], got %s",
                   SHP(&lg->shape, b1));
      if (lb->dtype != DT_I32)
        diag_error(g->diag, v->loc, "cross_entropy expects integer labels (i32), got %s",
                   dtype_name(lb->dtype));
      Shape want = lg->shape;
      want.rank--;
      if (!shape_eq(&lb->shape, &want))
        diag_error(g->diag, v->loc, "cross_entropy of logits %s and labels %s: expected labels %s",
                   SHP(&lg->shape, b1), SHP(&lb->shape, b2), shape_str(&want, (char[160]){0}, 160));
      v->dtype = lg->dtype;
    }
    break;
  case SHAPE_PAIR:
    s.rank = 1;
    s.dim[0] = 2;
    v->dtype = v->in[0]->dtype;
    break;
  case SHAPE_SAME:
    s = v->in[0]->shape;
    if (v->op == OP_CROSS_ENTROPY_GRAD || v->op == OP_TRANSFER) { /* a transfer copies any dtype */
      v->dtype = v->in[0]->dtype;
      break;
    }
    for (int i = 0; i < v->n_in; i++) need_float(g, v, i);
    need_same_dtype(g, v);
    /* attention's operands are checked below (k and v have kv_heads heads) */
    for (int i = 1; v->op != OP_ATTENTION && v->op != OP_ATTENTION_DECODE && i < v->n_in; i++)
      if (!shape_eq(&v->in[i]->shape, &s))
        diag_error(g->diag, v->loc, "%s of %s and %s: shapes differ", op_info[v->op].name,
                   SHP(&s, b1), SHP(&v->in[i]->shape, b2));
    v->dtype = v->in[0]->dtype;
    break;
  case SHAPE_BROADCAST:
    need_float(g, v, 0);
    need_float(g, v, 1);
    need_same_dtype(g, v);
    if (!shape_broadcast(&v->in[0]->shape, &v->in[1]->shape, &s))
      diag_error(g->diag, v->loc, "cannot broadcast %s with %s in %s", SHP(&v->in[0]->shape, b1),
                 SHP(&v->in[1]->shape, b2), op_info[v->op].name);
    v->dtype = v->in[0]->dtype;
    break;
  case SHAPE_MATMUL: {
    /* operands are viewed as 2-D, leading axes merged into rows */
    Value *a = v->in[0], *b = v->in[1];
    need_float(g, v, 0);
    need_float(g, v, 1);
    need_same_dtype(g, v);
    if (a->shape.rank < 2 || b->shape.rank < 2)
      diag_error(g->diag, v->loc, "matmul of %s by %s: both operands must have rank 2 or more",
                 SHP(&a->shape, b1), SHP(&b->shape, b2));
    int64_t ar = shape_numel(&a->shape) / a->shape.dim[a->shape.rank - 1], ac = a->shape.dim[a->shape.rank - 1];
    int64_t br = shape_numel(&b->shape) / b->shape.dim[b->shape.rank - 1], bc = b->shape.dim[b->shape.rank - 1];
    int64_t m = v->attr.trans_a ? ac : ar, ka = v->attr.trans_a ? ar : ac;
    int64_t kb = v->attr.trans_b ? bc : br, n = v->attr.trans_b ? br : bc;
    if (ka != kb)
      diag_error(g->diag, v->loc, "matmul of %s by %s: inner dimensions differ (%" PRId64 " vs %" PRId64 ")",
                 SHP(&a->shape, b1), SHP(&b->shape, b2), ka, kb);
    if (!v->attr.trans_a && a->shape.rank > 2) {
      s = a->shape;
      s.dim[s.rank - 1] = n;
    } else {
      s.rank = 2;
      s.dim[0] = m;
      s.dim[1] = n;
    }
    v->dtype = a->dtype;
    break;
  }
  case SHAPE_EMBED: {
    Value *t = v->in[0], *ix = v->in[1];
    need_float(g, v, 0);
    if (t->shape.rank != 2)
      diag_error(g->diag, v->loc, "embedding expects a table of rank 2 [V,C], got %s", SHP(&t->shape, b1));
    if (ix->dtype != DT_I32)
      diag_error(g->diag, v->loc, "embedding expects integer indices (i32), got %s", dtype_name(ix->dtype));
    if (ix->shape.rank >= IR_MAX_RANK)
      diag_error(g->diag, v->loc, "embedding of indices %s: result would exceed rank %d", SHP(&ix->shape, b1),
                 IR_MAX_RANK);
    s = ix->shape;
    s.dim[s.rank++] = t->shape.dim[1];
    v->dtype = t->dtype;
    break;
  }
  case SHAPE_POSITIONS:
    if (v->in[0]->shape.rank < 1)
      diag_error(g->diag, v->loc, "positions expects a tensor of rank 1 or more, got a scalar");
    s.rank = 1;
    s.dim[0] = v->in[0]->shape.dim[v->in[0]->shape.rank - 1];
    v->dtype = DT_I32;
    break;
  case SHAPE_TRANSPOSE:
    if (v->in[0]->shape.rank != 2)
      diag_error(g->diag, v->loc, "transpose expects a tensor of rank 2, got %s", SHP(&v->in[0]->shape, b1));
    s.rank = 2;
    s.dim[0] = v->in[0]->shape.dim[1];
    s.dim[1] = v->in[0]->shape.dim[0];
    v->dtype = v->in[0]->dtype;
    break;
  case SHAPE_CAST:
    need_float(g, v, 0);
    s = v->in[0]->shape;
    v->dtype = v->op == OP_UNSCALE ? DT_F32 : v->attr.dtype;
    if (!dtype_is_float(v->dtype))
      diag_error(g->diag, v->loc, "%s to %s: the target must be a float dtype", op_info[v->op].name,
                 dtype_name(v->dtype));
    break;
  case SHAPE_MATMUL_I8: { /* the int8 GEMM of passes/quantize.c (--calibrate) */
    Value *x = v->in[0], *q = v->in[1];
    if (x->dtype != DT_F32 || q->dtype != DT_I8 || v->in[2]->dtype != DT_F32 || v->in[3]->dtype != DT_F32 ||
        x->shape.rank < 2 || q->shape.rank != 2 || shape_numel(&v->in[3]->shape) != 1)
      diag_error(g->diag, v->loc, "%s expects f32 activations of rank 2 or more, i8 weights of rank 2 and f32 "
                 "scales, got %s %s, %s %s", op_info[v->op].name, dtype_name(x->dtype), SHP(&x->shape, b1),
                 dtype_name(q->dtype), SHP(&q->shape, b2));
    int64_t kq = q->shape.dim[v->attr.trans_b ? 1 : 0], n = q->shape.dim[v->attr.trans_b ? 0 : 1];
    if (x->shape.dim[x->shape.rank - 1] != kq)
      diag_error(g->diag, v->loc, "%s of %s by %s: inner dimensions differ", op_info[v->op].name, SHP(&x->shape, b1),
                 SHP(&q->shape, b2));
    int64_t ns = shape_numel(&v->in[2]->shape);
    if (ns != 1 && ns != n)
      diag_error(g->diag, v->loc, "%s: %" PRId64 " weight scales for %" PRId64 " output channels",
                 op_info[v->op].name, ns, n);
    s = x->shape;
    s.dim[s.rank - 1] = n;
    v->dtype = DT_F32;
    break;
  }
  case SHAPE_DEQUANT: { /* int8 weights q and their scales s (passes/quantize.c) */
    Shape b;
    s = v->in[0]->shape;
    if (v->in[0]->dtype != DT_I8 || v->in[1]->dtype != DT_F32)
      diag_error(g->diag, v->loc, "%s expects i8 weights and f32 scales, got %s and %s", op_info[v->op].name,
                 dtype_name(v->in[0]->dtype), dtype_name(v->in[1]->dtype));
    if (v->in[1]->shape.rank != s.rank || !shape_broadcast(&s, &v->in[1]->shape, &b) || !shape_eq(&b, &s))
      diag_error(g->diag, v->loc, "%s of %s by scales %s: the scales must have the weights' rank and broadcast to "
                 "their shape", op_info[v->op].name, SHP(&s, b1), SHP(&v->in[1]->shape, b2));
    v->dtype = DT_F32;
    break;
  }
  case SHAPE_NONE:
    if (v->n_in < 1) diag_error(g->diag, v->loc, "%s takes at least one operand", op_info[v->op].name);
    for (int i = 0; i < v->n_in; i++) need_float(g, v, i);
    v->dtype = DT_VOID;
    break;
  case SHAPE_VOID:
    /* an 8-bit AdamW update's scales (operands 5, 6) have a block's shape:
     * ir_adamw_operands_error checks them */
    for (int i = 1; i < (v->op == OP_ADAMW && v->n_in == 6 ? 4 : v->n_in); i++)
      if (!shape_eq(&v->in[i]->shape, &v->in[0]->shape))
        diag_error(g->diag, v->loc, "%s: operand %d has shape %s, expected %s", op_info[v->op].name,
                   i + 1, SHP(&v->in[i]->shape, b1), SHP(&v->in[0]->shape, b2));
    v->dtype = DT_VOID;
    s = v->in[0]->shape;
    break;
  }
  if (v->op == OP_ATTENTION || v->op == OP_ATTENTION_DECODE) {
    /* q [B, T, C] in H heads; k, v [B, T, C K / H] in K heads, K | H
     * (grouped-query attention; the decoding caches are [B, context, C K / H]) */
    int64_t H = v->attr.heads, K = ir_kv_heads(&v->attr);
    if (s.rank != 3)
      diag_error(g->diag, v->loc, "attention expects q, k, v of rank 3 [batch, time, channels], got %s", SHP(&s, b1));
    if (H < 1 || s.dim[2] % H)
      diag_error(g->diag, v->loc, "attention: %" PRId64 " channels do not split into %" PRId64 " heads",
                 s.dim[2], H);
    if (K < 1 || H % K)
      diag_error(g->diag, v->loc, "attention: kv_heads %" PRId64 " does not divide heads %" PRId64, K, H);
    Shape kv = s;
    kv.dim[2] = s.dim[2] / H * K;
    for (int i = 1; i < 3; i++) {
      if (shape_eq(&v->in[i]->shape, &kv)) continue;
      if (K == H)
        diag_error(g->diag, v->loc, "%s of %s and %s: shapes differ", op_info[v->op].name, SHP(&s, b1),
                   SHP(&v->in[i]->shape, b2));
      diag_error(g->diag, v->loc, "attention of q %s with %" PRId64 " heads and %" PRId64 " kv_heads: %s must be %s, got %s",
                 SHP(&s, b1), H, K, i == 1 ? "k" : "v", shape_str(&kv, (char[160]){0}, 160), SHP(&v->in[i]->shape, b2));
    }
  }
  if (v->op == OP_ROPE || v->op == OP_ROPE_GRAD) { /* pairs of channels within each head */
    int64_t H = v->attr.heads;
    if (s.rank != 3)
      diag_error(g->diag, v->loc, "rope expects x of rank 3 [batch, time, channels], got %s", SHP(&s, b1));
    if (H < 1 || s.dim[2] % H)
      diag_error(g->diag, v->loc, "rope: %" PRId64 " channels do not split into %" PRId64 " heads", s.dim[2], H);
    if ((s.dim[2] / H) % 2)
      diag_error(g->diag, v->loc, "rope: the head dimension %" PRId64 " (%" PRId64 " channels / %" PRId64
                 " heads) is odd; rotary embeddings turn pairs of channels", s.dim[2] / H, s.dim[2], H);
    if (!(v->attr.base > 0) || !isfinite(v->attr.base))
      diag_error(g->diag, v->loc, "rope: base must be a finite number above 0, got %g", v->attr.base);
  }
  if ((v->op == OP_SOFTMAX || v->op == OP_SOFTMAX_GRAD) && (v->attr.axis < 0 || v->attr.axis >= s.rank))
    diag_error(g->diag, v->loc, "%s: axis %d is out of range for %s", op_info[v->op].name, v->attr.axis, SHP(&s, b1));
  if ((v->op == OP_RMS_NORM || v->op == OP_RMS_NORM_GRAD) && s.rank < 1)
    diag_error(g->diag, v->loc, "%s normalises the last axis: it needs a tensor of rank 1 or more, got a scalar",
               op_info[v->op].name);
  v->shape = s;
  check_numel(g, v);
}

/* ------------------------------------------------------------- verifier */

int ir_check_allreduce(const Graph *g, const Value **bad, char *msg, size_t n) {
  int nv = g->n_values, buckets = 0, found = 0;
  bool any = false;
  for (int i = 0; i < nv && !any; i++) any = g->values[i]->op == OP_ALLREDUCE || g->values[i]->op == OP_REDUCE_SCATTER;
  if (!any) return 0;
  Arena *a = arena_new(1 << 12);
  int *upd = arena_alloc(a, ((size_t)nv + 1) * sizeof *upd), *in_bucket = arena_alloc(a, ((size_t)nv + 1) * sizeof *in_bucket);
  int *at = arena_alloc(a, ((size_t)nv + 1) * sizeof *at); /* gradient -> position of its bucket */
  for (int i = 0; i < nv; i++) upd[i] = in_bucket[i] = at[i] = -1;
  for (int i = 0; i < nv; i++) {
    const Value *u = g->values[i];
    if ((u->op == OP_ADAMW || u->op == OP_SGD) && u->n_in > 1 && u->in[1] && u->in[1]->id >= 0 && u->in[1]->id < nv)
      upd[u->in[1]->id] = i;
    if ((u->op == OP_ADAMW || u->op == OP_SGD) && u->n_in > 1 && u->in[1] && ir_tied_add(u->in[1]))
      for (int j = 0; j < u->in[1]->n_in; j++) { /* a tied weight's parts: bucketed in its place */
        const Value *x = ir_tied_part(u->in[1]->in[j]);
        if (x && x->id >= 0 && x->id < nv) upd[x->id] = i;
      }
  }
#define BAD(v, ...) do { *bad = (v); snprintf(msg, n, __VA_ARGS__); found = 1; goto out; } while (0)
  for (int i = 0; i < nv; i++) {
    const Value *v = g->values[i];
    if (v->op != OP_ALLREDUCE && v->op != OP_REDUCE_SCATTER) continue;
    if (g->replicas <= 1) BAD(v, "an all-reduce in a graph of one replica (there is no `replicas N` line)");
    if ((v->op == OP_REDUCE_SCATTER) != (g->zero > 0))
      BAD(v, "%s in a graph %s `zero 1` (--zero 1 makes every bucket a reduce_scatter)",
          v->op == OP_REDUCE_SCATTER ? "a reduce_scatter" : "an allreduce", g->zero ? "with" : "without");
    if (v->attr.bucket != buckets) BAD(v, "bucket %d, expected %d (buckets are numbered in graph order)", v->attr.bucket, buckets);
    buckets++;
    int64_t bytes = 0;
    for (int j = 0; j < v->n_in; j++) {
      const Value *x = v->in[j];
      if (!x || x->id < 0 || x->id >= nv || g->values[x->id] != x) continue; /* the SSA checks report it */
      bytes += (int64_t)dtype_size(x->dtype) * shape_numel(&x->shape);
      if (upd[x->id] < 0) BAD(v, "%%%d is not the gradient an optimizer update reads", x->id);
      if (v->op == OP_REDUCE_SCATTER) { /* grouped by the replica that updates each */
        const Value *u = g->values[upd[x->id]];
        if (!u->attr.sharded || u->attr.shard < 0 || u->attr.shard >= g->replicas)
          BAD(v, "the update of gradient %%%d has no shard of the %d replicas", x->id, g->replicas);
        if (j > 0 && upd[v->in[j - 1]->id] >= 0 && g->values[upd[v->in[j - 1]->id]]->attr.shard > u->attr.shard)
          BAD(v, "gradient %%%d (shard %d) comes after one of shard %d: a reduce_scatter's operands are grouped by "
              "shard in order", x->id, u->attr.shard, g->values[upd[v->in[j - 1]->id]]->attr.shard);
      }
      if (upd[x->id] < i)
        BAD(v, "bucket %d comes after the update of param %%%d, which reads its gradient %%%d", v->attr.bucket,
            g->values[upd[x->id]]->in[0]->id, x->id);
      if (in_bucket[x->id] >= 0) BAD(v, "gradient %%%d is in bucket %d already", x->id, in_bucket[x->id]);
      in_bucket[x->id] = v->attr.bucket;
      at[x->id] = i;
    }
    if (v->attr.bytes != bytes) BAD(v, "bucket %d says %" PRId64 " bytes, its gradients have %" PRId64, v->attr.bucket,
                                    v->attr.bytes, bytes);
  }
  for (int i = 0; i < nv; i++) {
    const Value *v = g->values[i];
    if ((v->op == OP_ADAMW || v->op == OP_SGD) && v->n_in > 1 && v->in[1] && v->in[1]->id >= 0 && v->in[1]->id < nv &&
        !ir_tied_add(v->in[1]) && in_bucket[v->in[1]->id] < 0)
      BAD(v, "the gradient %%%d this update reads is in no all-reduce bucket", v->in[1]->id);
    if (v->op == OP_ALL_GATHER) { /* params, each after its own (sharded) update */
      if (!g->zero) BAD(v, "an all_gather in a graph without `zero 1`");
      for (int j = 0; j < v->n_in; j++) {
        const Value *x = v->in[j];
        int at_upd = -1;
        for (int k = 0; k < i && x; k++) {
          const Value *u = g->values[k];
          if ((u->op == OP_ADAMW || u->op == OP_SGD) && u->n_in > 0 && u->in[0] == x) at_upd = k;
        }
        if (!x || x->op != OP_PARAM || at_upd < 0)
          BAD(v, "operand %d is not a param updated before this all_gather", j);
      }
    }
    if ((v->op == OP_ADAMW || v->op == OP_SGD) && v->attr.sharded != (g->zero > 0))
      BAD(v, "an update %s a shard in a graph %s `zero 1`", v->attr.sharded ? "with" : "without",
          g->zero ? "with" : "without");
    if (v->op == OP_ADAMW || v->op == OP_SGD || v->op == OP_ALLREDUCE || v->op == OP_REDUCE_SCATTER ||
        v->op == OP_ALL_GATHER || ir_tied_add(v) || (v->op == OP_TRANSFER && v->role == ROLE_OPTIMIZER))
      continue; /* they read the sums */
    for (int j = 0; j < v->n_in; j++) { /* the sum replaces a bucket's gradients in place */
      const Value *x = v->in[j];
      if (x && x->id >= 0 && x->id < nv && at[x->id] >= 0 && at[x->id] < i)
        BAD(v, "reads gradient %%%d after its all-reduce (bucket %d) has replaced it by the replicas' sum", x->id,
            in_bucket[x->id]);
    }
  }
#undef BAD
out:
  arena_free(a);
  return found;
}

const char *ir_adamw_operands_error(Value *const *in, int n) {
  if (n != 4 && n != 6) return "takes 4 operands (param, grad, exp_avg, exp_avg_sq) or 6 (8-bit state)";
  const Value *p = in[0];
  int64_t numel = shape_numel(&p->shape);
  if (!dtype_is_float(p->dtype) || in[1]->dtype != p->dtype || !shape_eq(&in[1]->shape, &p->shape))
    return "expects a float param and its gradient of the same dtype and shape";
  if (n == 4) {
    for (int j = 2; j < 4; j++)
      if (in[j]->op != OP_STATE || in[j]->dtype != p->dtype || !shape_eq(&in[j]->shape, &p->shape))
        return "expects its exp_avg and exp_avg_sq: states of the param's dtype and shape";
    return NULL;
  }
  if (p->dtype != DT_F32) return "with 8-bit state expects an f32 param";
  for (int j = 2; j < 4; j++)
    if (in[j]->op != OP_STATE || in[j]->dtype != DT_U8 || shape_numel(&in[j]->shape) != numel)
      return "with 8-bit state expects the exp_avg and exp_avg_sq codes: u8 states of the param's element count";
  int64_t blocks = (numel + IR_Q8_BLOCK - 1) / IR_Q8_BLOCK;
  for (int j = 4; j < 6; j++)
    if (in[j]->op != OP_STATE || in[j]->dtype != DT_F32 || in[j]->shape.rank != 1 || in[j]->shape.dim[0] != blocks)
      return "with 8-bit state expects the exp_avg and exp_avg_sq scales: f32 states of one element per block of 2048";
  return NULL;
}

int ir_verify(const Graph *g, const char *after_pass, FILE *err) {
  int bad = 0;
#define VFAIL(...)                                                                   \
  do {                                                                               \
    fprintf(err, "duet: IR verifier (after %s): %%%d %s: ", after_pass, v->id,      \
            op_info[v->op].name);                                                    \
    fprintf(err, __VA_ARGS__);                                                       \
    fputc('\n', err);                                                                \
    bad++;                                                                           \
  } while (0)
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->id != i) VFAIL("id %d at position %d", v->id, i);
    if (v->op < 0 || v->op >= OP_COUNT) {
      fprintf(err, "duet: IR verifier (after %s): bad op at %d\n", after_pass, i);
      bad++;
      continue;
    }
    if (op_info[v->op].arity >= 0 && op_info[v->op].arity != v->n_in)
      VFAIL("has %d operands, expected %d", v->n_in, op_info[v->op].arity);
    if (g->n_stages > 1) { /* partitioned: every op on one device, operands local but for transfers */
      if (v->device < 0 || v->device >= g->n_stages) VFAIL("device %d outside 0..%d", v->device, g->n_stages - 1);
      for (int j = 0; j < v->n_in && v->in[j]; j++)
        if ((v->in[j]->device == v->device) != (v->op != OP_TRANSFER))
          VFAIL("operand %d is on device %d, the op on %d", j, v->in[j]->device, v->device);
    }
    for (int j = 0; j < v->n_in; j++) {
      const Value *x = v->in[j];
      if (!x || x->id >= i || g->values[x->id] != x) VFAIL("operand %d is not defined before use", j);
      else if (x->dtype == DT_VOID) VFAIL("operand %d has no result", j);
    }
    if (v->op == OP_FUSED) {
      const FusedProg *p = v->attr.prog;
      if (!p || p->n < 1) VFAIL("empty fused program");
      else
        for (int k = 0; k < p->n; k++) {
          const FusedInstr *fi = &p->ins[k];
          if (fi->op == OP_COUNT) {
            if (fi->a < 0 || fi->a >= v->n_in) VFAIL("fused load of input %d", fi->a);
          } else {
            if (!(op_info[fi->op].flags & OPF_EW) || fi->op == OP_FUSED) VFAIL("non-elementwise op in fused program");
            int ar = op_info[fi->op].arity;
            if ((ar >= 1 && (fi->a < 0 || fi->a >= k)) || (ar >= 2 && (fi->b < 0 || fi->b >= k)))
              VFAIL("fused instruction %d uses a later instruction", k);
          }
        }
    }
    if (v->op == OP_ADAMW) {
      const char *why = ir_adamw_operands_error(v->in, v->n_in);
      if (why) VFAIL("%s", why);
    }
    if (v->op == OP_PRUNE_MASK) {
      bool ok = v->n_in >= 2 && v->n_in <= 4 && v->in[0]->op == OP_PARAM && v->in[1]->op == OP_STATE;
      for (int j = 1; ok && j < v->n_in; j++)
        ok = v->in[j]->op == OP_STATE && (v->in[j]->dtype == v->in[0]->dtype || (j >= 2 && v->in[j]->dtype == DT_U8)) &&
             shape_numel(&v->in[j]->shape) == shape_numel(&v->in[0]->shape);
      if (!ok) VFAIL("expects a param, its mask and at most two optimizer states (states of the param's dtype, or "
                     "8-bit AdamW codes)");
      if (v->n_in >= 1 && v->attr.axis != -1 && v->attr.axis != 0 && v->attr.axis != v->in[0]->shape.rank - 1)
        VFAIL("output axis %d is neither the first nor the last", v->attr.axis);
    }
    if ((op_info[v->op].flags & OPF_SIDE) && v->dtype != DT_VOID) VFAIL("side-effect op with a result");
    if (!(op_info[v->op].flags & OPF_SIDE) && v->dtype == DT_VOID) VFAIL("value without dtype");
    if (shape_numel(&v->shape) < 0) VFAIL("element count overflows");
  }
#undef VFAIL
  const Value *ab;
  char abuf[256];
  if (ir_check_allreduce(g, &ab, abuf, sizeof abuf)) {
    fprintf(err, "duet: IR verifier (after %s): %%%d %s: %s\n", after_pass, ab->id, op_info[ab->op].name, abuf);
    bad++;
  }
  MemConflict mc;
  if (!bad && ir_check_memory(g, &mc)) {
    char buf[512];
    fprintf(err, "duet: IR verifier (after %s): %s\n", after_pass, ir_memconflict_str(g, &mc, buf, sizeof buf));
    bad++;
  }
  return bad;
}

/* Never freed by memplan: written or read by the host around a step. */
static bool mem_pinned(const Graph *g, const Value *v) {
  return v->op == OP_INPUT || v == g->loss || v->op == OP_EVAL_METRICS || v->region != MEM_ARENA;
}

int ir_check_memory(const Graph *g, MemConflict *c) {
  int n = g->n_values, S = g->n_stages > 1 ? g->n_stages : 1;
  bool planned = false;
  for (int i = 0; i < n && !planned; i++) planned = g->values[i]->region != MEM_NONE;
  if (!planned) return 0;
  Arena *a = arena_new(1 << 16);
  int *last = arena_alloc(a, ((size_t)n + 1) * sizeof *last);
  int *head = arena_alloc(a, ((size_t)n + 1) * sizeof *head);
  int *next = arena_alloc(a, ((size_t)n + 1) * sizeof *next);
  int *group = arena_alloc(a, ((size_t)n + 1) * sizeof *group);
  RangeSet *sets = arena_alloc(a, (size_t)S * MEM_COUNT * sizeof *sets);
  for (int k = 0; k < S * MEM_COUNT; k++) sets[k].arena = a;
  for (int i = 0; i < n; i++) {
    const Value *v = g->values[i];
    last[i] = i;
    head[i] = -1;
    for (int j = 0; j < v->n_in; j++) {
      const Value *x = v->in[j];
      if (x && x->id >= 0 && x->id < i && g->values[x->id] == x && last[x->id] < i) last[x->id] = i;
    }
  }
  int found = 0;
  /* first what lives from the start (inputs, params, state, caches), then
   * the others in graph order, each after the blocks it outlives are gone */
  for (int pass = 0; pass < 2 && !found; pass++) {
    int freed = 0;
    for (int i = 0; i < n && !found; i++) {
      const Value *v = g->values[i];
      bool from_start = v->op == OP_INPUT || (v->region != MEM_NONE && v->region != MEM_ARENA);
      if (from_start != (pass == 0) || v->region <= MEM_NONE || v->region >= MEM_COUNT || v->dtype == DT_VOID) continue;
      int dev = S > 1 ? v->device : 0;
      int64_t numel = shape_numel(&v->shape), ws = ir_workspace_elems(v);
      if (dev < 0 || dev >= S || numel < 0 || ws < 0 || numel > INT64_MAX / 16 - ws) continue; /* reported elsewhere */
      int64_t bytes = (int64_t)dtype_size(v->dtype) * (numel + ws);
      if (bytes < 1 || v->offset < 0 || v->offset > INT64_MAX - bytes) continue;
      for (; pass == 1 && freed < i; freed++)
        for (int j = head[freed]; j >= 0; j = next[j]) rangeset_remove(&sets[group[j]], g->values[j]->offset);
      group[i] = dev * MEM_COUNT + (int)v->region;
      int64_t o_off, o_size;
      int other = rangeset_overlap(&sets[group[i]], v->offset, bytes, &o_off, &o_size);
      if (other >= 0) {
        c->a = g->values[other];
        c->b = v;
        c->a_last = mem_pinned(g, c->a) ? -1 : last[other];
        found = 1;
        break;
      }
      rangeset_insert(&sets[group[i]], v->offset, bytes, i);
      if (!mem_pinned(g, v)) {
        next[i] = head[last[i]];
        head[last[i]] = i;
      }
    }
  }
  arena_free(a);
  return found;
}

char *ir_memconflict_str(const Graph *g, const MemConflict *c, char *buf, size_t n) {
  const Value *a = c->a, *b = c->b;
  int64_t ab = (int64_t)dtype_size(a->dtype) * (shape_numel(&a->shape) + ir_workspace_elems(a));
  int64_t bb = (int64_t)dtype_size(b->dtype) * (shape_numel(&b->shape) + ir_workspace_elems(b));
  char dev[40] = "";
  if (g->n_stages > 1) snprintf(dev, sizeof dev, " on device %d", b->device);
  char why[120];
  if (c->a_last >= 0 && c->a_last == b->id)
    snprintf(why, sizeof why, "which it reads (no kernel runs in place: operands keep their own bytes)");
  else if (c->a_last >= 0)
    snprintf(why, sizeof why, "which is still live (its last use is %%%d)", c->a_last);
  else if (a->region == MEM_ARENA)
    snprintf(why, sizeof why, "which is live for the whole step (inputs, the loss and eval metrics are never reused)");
  else
    snprintf(why, sizeof why, "which is never freed (params, optimizer state and caches)");
  snprintf(buf, n, "%%%d: %" PRId64 " bytes at @%s+%" PRId64 "%s overlap %%%d (%" PRId64 " bytes at @%s+%" PRId64 "), %s",
           b->id, bb, mem_region_name(b->region), b->offset, dev, a->id, ab, mem_region_name(a->region), a->offset, why);
  return buf;
}

/* -------------------------------------------------------------- printer */

char *ir_num_str(double x, char *buf, size_t n) {
  /* the fewest significant digits that read back exactly (at most 17) */
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, n, "%.*g", prec, x);
    if (strtod(buf, NULL) == x) break;
  }
  return buf;
}

#define NUM(x) ir_num_str((x), (char[32]){0}, 32)

static const char *const role_names[] = {"forward", "backward", "optimizer", "eval"};
static const char *const region_names[MEM_COUNT] = {"none", "param", "state", "arena", "cache"};
const char *role_name(Role r) { return (unsigned)r < 4 ? role_names[r] : "?"; }
const char *mem_region_name(MemRegion r) { return (unsigned)r < MEM_COUNT ? region_names[r] : "?"; }

/* A string literal: quotes, backslashes and control bytes escaped. */
static void print_string(const char *s, FILE *out) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p == '\n') fputs("\\n", out);
    else if (*p == '\t') fputs("\\t", out);
    else if (*p < 0x20 || *p == 0x7F) fprintf(out, "\\x%02x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

static void print_type(const Value *v, FILE *out) {
  char b[160];
  if (v->dtype == DT_VOID)
    fputs("void", out);
  else
    fprintf(out, "%s%s", dtype_name(v->dtype), shape_str(&v->shape, b, sizeof b));
}

void ir_print_value(const Graph *g, const Value *v, FILE *out) {
  (void)g;
  char b[160];
  if (v->dtype != DT_VOID) fprintf(out, "%%%d = ", v->id);
  fputs(op_info[v->op].name, out);
  switch (v->op) {
  case OP_INPUT:
  case OP_STATE:
    fputc(' ', out);
    print_string(v->attr.name, out);
    if (v->attr.kv_cache) fputs(" kv_cache", out);
    if (v->op == OP_STATE && v->attr.init == INIT_ONES) fputs(" ones", out);
    break;
  case OP_PARAM:
    fputc(' ', out);
    print_string(v->attr.name, out);
    fprintf(out, " %s", init_name(v->attr.init));
    if (v->attr.init == INIT_NORMAL) fprintf(out, "(%s)", NUM(v->attr.init_a));
    if (v->attr.init == INIT_UNIFORM) fprintf(out, "(%s, %s)", NUM(v->attr.init_a), NUM(v->attr.init_b));
    break;
  case OP_CONST:
    fprintf(out, " %s", NUM(v->attr.value));
    break;
  case OP_MATMUL:
  case OP_MATMUL_I8:
    if (v->attr.trans_a || v->attr.trans_b)
      fprintf(out, "[%s%s]", v->attr.trans_a ? "ta" : "", v->attr.trans_b ? (v->attr.trans_a ? ",tb" : "tb") : "");
    break;
  case OP_BROADCAST:
  case OP_SUM_TO:
  case OP_MAX_TO:
  case OP_MAX_TO_GRAD:
  case OP_EMBEDDING_GRAD:
    fprintf(out, "%s", shape_str(&v->attr.shape, b, sizeof b));
    break;
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD:
  case OP_ATTENTION_DECODE:
    fprintf(out, "[heads=%" PRId64, v->attr.heads);
    if (ir_kv_heads(&v->attr) != v->attr.heads) fprintf(out, ",kv_heads=%" PRId64, v->attr.kv_heads);
    fprintf(out, "%s]", v->attr.causal ? ",causal" : "");
    break;
  case OP_ROPE:
  case OP_ROPE_GRAD:
    if (v->attr.base == floor(v->attr.base) && fabs(v->attr.base) < 0x1p53) /* 10000, not 1e+04 */
      fprintf(out, "[heads=%" PRId64 ",base=%.0f]", v->attr.heads, v->attr.base);
    else
      fprintf(out, "[heads=%" PRId64 ",base=%s]", v->attr.heads, NUM(v->attr.base));
    break;
  case OP_SOFTMAX:
  case OP_SOFTMAX_GRAD:
    fprintf(out, "[axis=%d]", v->attr.axis);
    break;
  case OP_SLICE:
  case OP_SLICE_GRAD:
    fprintf(out, "[axis=%d,start=%" PRId64 "%s]%s", v->attr.axis, v->attr.index, v->attr.squeeze ? ",squeeze" : "",
            shape_str(&v->attr.shape, b, sizeof b));
    break;
  case OP_RESHAPE:
  case OP_CONCAT:
    if (v->op == OP_CONCAT) fprintf(out, "[axis=%d]", v->attr.axis);
    fprintf(out, "%s", shape_str(&v->attr.shape, b, sizeof b));
    break;
  case OP_PERMUTE:
    fputs("[", out);
    for (int d = 0; d < v->attr.shape.rank; d++) fprintf(out, "%s%d", d ? "," : "", v->attr.perm[d]);
    fputs("]", out);
    break;
  case OP_IM2COL: case OP_COL2IM: case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_AVGPOOL: case OP_AVGPOOL_GRAD:
    fprintf(out, "[k=%" PRId64 "x%" PRId64 ",s=%" PRId64 "x%" PRId64 ",p=%" PRId64 "x%" PRId64 ",d=%" PRId64 "x%" PRId64 "]",
            v->attr.kh, v->attr.kw, v->attr.sh, v->attr.sw, v->attr.ph, v->attr.pw, v->attr.dh, v->attr.dw);
    break;
  case OP_DROPOUT:
    fprintf(out, "[p=%s,site=%" PRId64 "]", NUM(v->attr.p), v->attr.site);
    break;
  case OP_UNSCALE:
    fprintf(out, "[slot=%d]", v->attr.slot);
    break;
  case OP_ALLREDUCE:
  case OP_REDUCE_SCATTER:
    fprintf(out, "[bucket=%d,bytes=%" PRId64 "]", v->attr.bucket, v->attr.bytes);
    break;
  case OP_ALL_GATHER:
    fprintf(out, "[bucket=%d]", v->attr.bucket);
    break;
  case OP_NORM:
  case OP_NORM_GRAD:
  case OP_RMS_NORM:
  case OP_RMS_NORM_GRAD:
    fprintf(out, "[eps=%s]", NUM(v->attr.eps));
    break;
  case OP_ADAMW:
  case OP_SGD:
    if (v->attr.no_decay && v->attr.sharded) fprintf(out, "[no_decay,shard=%d]", v->attr.shard);
    else if (v->attr.sharded) fprintf(out, "[shard=%d]", v->attr.shard);
    else if (v->attr.no_decay) fputs("[no_decay]", out);
    break;
  case OP_PRUNE_MASK:
    if (v->attr.axis >= 0) fprintf(out, "[out=%d]", v->attr.axis);
    break;
  case OP_FUSED: {
    const FusedProg *p = v->attr.prog;
    fputs("{", out);
    for (int k = 0; k < p->n; k++) {
      const FusedInstr *fi = &p->ins[k];
      fputs(k ? "; " : "", out);
      if (fi->op == OP_COUNT)
        fprintf(out, "$%d = in%d", k, fi->a);
      else if (fi->op == OP_CONST)
        fprintf(out, "$%d = %s", k, NUM(fi->value));
      else if (fi->op == OP_DROPOUT)
        fprintf(out, "$%d = dropout[p=%s,site=%" PRId64 "] $%d", k, NUM(fi->value), fi->site, fi->a);
      else if (fi->op == OP_CAST)
        fprintf(out, "$%d = cast[%s] $%d", k, dtype_name((DType)fi->site), fi->a);
      else if (op_info[fi->op].arity == 0)
        fprintf(out, "$%d = %s", k, op_info[fi->op].name);
      else if (op_info[fi->op].arity == 1)
        fprintf(out, "$%d = %s $%d", k, op_info[fi->op].name, fi->a);
      else
        fprintf(out, "$%d = %s $%d, $%d", k, op_info[fi->op].name, fi->a, fi->b);
    }
    fputs("}", out);
    break;
  }
  default:
    break;
  }
  for (int i = 0; i < v->n_in; i++) fprintf(out, "%s%%%d", i ? ", " : " ", v->in[i]->id);
  fputs(" : ", out);
  print_type(v, out);
  if (v->role != ROLE_FORWARD) fprintf(out, "  @%s", role_names[v->role]);
  if (v->block > 0) fprintf(out, "  @block(%d)", v->block);
  if (v->device >= 0) fprintf(out, "  @device(%d)", v->device);
  if (v->region != MEM_NONE) fprintf(out, "  @%s+%" PRId64, region_names[v->region], v->offset);
  fputc('\n', out);
}

/* The train section, with the key names of the .model language. */
static void print_train(const TrainSpec *t, FILE *out) {
  fputs("train {\n", out);
  if (t->data == DATA_FASHION_MNIST || t->data == DATA_TEXT || t->data == DATA_TOKENS) {
    fprintf(out, "  data = %s(", t->data == DATA_TEXT ? "text" : t->data == DATA_TOKENS ? "tokens" : "fashion_mnist");
    print_string(t->data_path ? t->data_path : "", out);
    if (t->data != DATA_FASHION_MNIST) fprintf(out, ", block = %" PRId64, t->block);
    else if (t->val_fraction > 0) fprintf(out, ", val_fraction = %s", NUM(t->val_fraction));
    fputs(")\n", out);
  } else if (t->data == DATA_NPY) {
    fputs("  data = npy(", out);
    print_string(t->data_path ? t->data_path : "", out);
    fputs(", ", out);
    print_string(t->data_y ? t->data_y : "", out);
    if (t->val_fraction > 0) fprintf(out, ", val_fraction = %s", NUM(t->val_fraction));
    if (t->val_x) {
      fputs(", val_x = ", out);
      print_string(t->val_x, out);
      fputs(", val_y = ", out);
      print_string(t->val_y ? t->val_y : "", out);
    }
    fputs(")\n", out);
  }
  if (t->optimizer == OPTIM_SGD)
    fprintf(out, "  optimizer = sgd(lr = %s, momentum = %s, weight_decay = %s", NUM(t->lr), NUM(t->momentum),
            NUM(t->weight_decay));
  else
    fprintf(out, "  optimizer = adamw(lr = %s, weight_decay = %s, beta1 = %s, beta2 = %s, eps = %s", NUM(t->lr),
            NUM(t->weight_decay), NUM(t->beta1), NUM(t->beta2), NUM(t->eps));
  if (t->decay_matrices_only) fputs(", decay = \"matrices\"", out);
  fputs(t->optimizer == OPTIM_ADAMW && t->state_int8 ? ", state = int8)\n" : ")\n", out);
  fprintf(out, "  batch = %" PRId64 "\n  epochs = %" PRId64 "\n", t->batch, t->epochs);
  if (t->steps > 0) fprintf(out, "  steps = %" PRId64 "\n", t->steps);
  fprintf(out, "  seed = %" PRIu64 "\n  log_every = %" PRId64 "\n  eval = %s\n", t->seed, t->log_every,
          t->eval ? "true" : "false");
  if (t->eval_every > 0) fprintf(out, "  eval_every = %" PRId64 "\n", t->eval_every);
  if (t->precision) fprintf(out, "  precision = \"%s\"\n", t->precision);
  if (t->recompute) fprintf(out, "  recompute = \"%s\"\n", t->recompute);
  if (t->offload) fprintf(out, "  offload = \"%s\"\n", t->offload);
  fprintf(out, "  eval_batches = %" PRId64 "\n", t->eval_batches);
  if (t->micro_batches > 1) fprintf(out, "  micro_batches = %" PRId64 "\n", t->micro_batches);
  static const char *const sched[] = {"constant", "cosine", "linear"};
  if (t->lr_schedule != LR_CONSTANT)
    fprintf(out, "  lr_schedule = %s(warmup = %" PRId64 ", min_lr = %s)\n", sched[t->lr_schedule], t->warmup,
            NUM(t->min_lr));
  else if (t->warmup > 0)
    fprintf(out, "  lr_schedule = constant(warmup = %" PRId64 ")\n", t->warmup);
  if (t->clip_grad_norm > 0) fprintf(out, "  clip_grad_norm = %s\n", NUM(t->clip_grad_norm));
  fputs("}\n", out);
}

/* The prune section as one header line (docs/ir.md): the mode and the
 * fields given (after the prune pass, all of them). */
static void print_prune(const PruneSpec *p, FILE *out) {
  char m[32];
  fprintf(out, "prune mode=\"%s\"", prune_mode_str(p, m, sizeof m));
  if (p->set & PRUNE_SET_SPARSITY) fprintf(out, " sparsity=%s", NUM(p->sparsity));
  if (p->set & PRUNE_SET_INITIAL) fprintf(out, " initial=%s", NUM(p->initial));
  if (p->set & PRUNE_SET_START) fprintf(out, " start=%" PRId64, p->start);
  if (p->set & PRUNE_SET_END) fprintf(out, " end=%" PRId64, p->end);
  if (p->set & PRUNE_SET_EVERY) fprintf(out, " every=%" PRId64, p->every);
  if (p->set & PRUNE_SET_PARAMS) {
    fputs(" params=", out);
    print_string(p->params ? p->params : "", out);
  }
  fputc('\n', out);
}

static bool in_graph(const Graph *g, const Value *v) {
  return v && v->id >= 0 && v->id < g->n_values && g->values[v->id] == v;
}

void ir_print(const Graph *g, FILE *out) {
  fprintf(out, "model %s\n", g->model_name ? g->model_name : "?");
  if (g->after_pass) fprintf(out, "after %s\n", g->after_pass);
  if (g->float_dtype != DT_F32) fprintf(out, "float_dtype %s\n", dtype_name(g->float_dtype));
  if (g->decode) fprintf(out, "decode context=%" PRId64 "\n", g->context);
  if (g->n_stages > 1) fprintf(out, "stages %d\n", g->n_stages);
  if (g->replicas > 1) fprintf(out, "replicas %d\n", g->replicas);
  if (g->replicas > 1 && g->bucket_mb > 0) fprintf(out, "bucket_mb %s\n", ir_num_str(g->bucket_mb, (char[32]){0}, 32));
  if (g->zero) fprintf(out, "zero %d\n", g->zero);
  if (g->qat) fprintf(out, "qat %d\n", g->qat); /* the quantize section: 1 int8 per channel, 2 per tensor */
  print_train(&g->train, out);
  if (g->prune.mode != PRUNE_NONE) print_prune(&g->prune, out);
  for (int i = 0; i < g->n_shrink; i++) { /* the shrink pass's table */
    const ShrinkAxis *x = &g->shrink[i];
    fputs("shrink param=", out);
    print_string(x->param, out);
    fprintf(out, " axis=%d full=%" PRId64 " group=%" PRId64 " source=", x->axis, x->full, x->group);
    print_string(x->source, out);
    fprintf(out, " kind=%s", x->kind == SHRINK_OWN ? "own" : x->kind == SHRINK_BIAS ? "bias" : "next");
    if (x->kind == SHRINK_NEXT) {
      fprintf(out, " out=%d acts=", x->next_out);
      print_string(x->acts ? x->acts : "", out);
      fprintf(out, " fold=%d", x->fold);
      if (x->next_bias) {
        fputs(" bias=", out);
        print_string(x->next_bias, out);
      }
    }
    fputc('\n', out);
  }
  bool planned = false;
  for (int r = 1; r < MEM_COUNT; r++) planned |= g->region_bytes[r] != 0;
  if (planned && g->n_stages <= 1) {
    fputs("regions", out);
    for (int r = 1; r < MEM_COUNT; r++) fprintf(out, " %s=%" PRId64, region_names[r], g->region_bytes[r]);
    fputc('\n', out);
  }
  for (int d = 0; planned && g->n_stages > 1 && d < g->n_stages; d++) {
    fprintf(out, "regions device %d", d);
    for (int r = 1; r < MEM_COUNT; r++) fprintf(out, " %s=%" PRId64, region_names[r], g->stage_bytes[d][r]);
    fputc('\n', out);
  }
  for (int i = 0; i < g->n_values; i++) ir_print_value(g, g->values[i], out);
  if (in_graph(g, g->loss)) fprintf(out, "loss %%%d\n", g->loss->id);
  if (in_graph(g, g->logits)) fprintf(out, "logits %%%d\n", g->logits->id);
  if (in_graph(g, g->labels)) fprintf(out, "labels %%%d\n", g->labels->id);
  for (int i = 0; i < g->n_values; i++) {
    const Value *v = g->values[i];
    if (v->op == OP_PARAM && in_graph(g, v->grad)) fprintf(out, "grad %%%d %%%d\n", v->id, v->grad->id);
  }
}
