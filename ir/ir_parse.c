/* ir/ir_parse.c: the IR text form, read back.  ir_print's output is this
 * parser's input (docs/ir.md has the grammar):
 *
 *   file    -> header* line*
 *   header  -> `model` NAME | `after` PASS | `float_dtype` DTYPE | `stages` N | `replicas` N
 *            | `bucket_mb` X | `zero` 1
 *            | `decode context=`N | `train {` (KEY `=` VALUE)* `}`
 *            | `regions` (REGION `=` N)*
 *            | `prune` (KEY `=` VALUE)*    (mode, sparsity, initial, start, end, every, params)
 *   line    -> [`%`ID `=`] OP [ATTRS] [`%`ID (`,` `%`ID)*] `:` TYPE ANNOT*
 *            | `loss` `%`ID | `logits` `%`ID | `labels` `%`ID | `grad` `%`P `%`G
 *   TYPE    -> `void` | DTYPE `[` [N (`,` N)*] `]`
 *   ANNOT   -> `@`ROLE | `@block(`N`)` | `@device(`N`)` | `@`REGION`+`OFFSET
 *
 * A hand-written line parser over the source text (the format is one
 * construct a line, so no token stream is needed).  Every value goes through
 * graph_add, whose shape rules check it against its operands; the declared
 * type must equal the inferred one.  Checks that the shape rules leave to the
 * frontend (slice bounds, concat extents, window sizes, fused programs,
 * memory regions, the data inputs) are made here too, so that an edited file
 * cannot make generated code read or write out of bounds.  Errors go through
 * the Diag channel with the line and a caret, like .model errors. */
#include "ir.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct IdSlot {
  int64_t id; /* -1: empty */
  Value *v;
  int line;
} IdSlot;

typedef struct Parser {
  Arena *a;
  Diag *d;
  const Source *src;
  Graph *g;
  const char *bol, *eol, *p; /* the current line and the cursor in it */
  int line;
  IdSlot *slots; /* %id -> value, open addressing */
  size_t cap;
  int *shrink_lines; /* the line of each shrink line (check_shrink) */
  int model_line, after_line, train_line, regions_line, float_line, decode_line, stages_line, replicas_line, prune_line, zero_line, qat_line,
      bucket_line;
  uint64_t device_regions[IR_MAX_STAGES / 64 + 1]; /* `regions device N` lines seen */
  int loss_line, logits_line, labels_line;
  bool in_train; /* inside the lines of `train { ... }` */
  unsigned train_keys; /* bit per key already set */
  bool have_regions;
  int64_t cur_id; /* the %id the current line defines (-1: none) */
} Parser;

/* ------------------------------------------------------------ errors */

static _Noreturn void fail_loc(Parser *P, Loc loc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  diag_vreport(P->d, loc, "error", fmt, ap);
  va_end(ap);
  P->d->n_errors++;
  longjmp(*P->d->jmp, 1);
}

static Loc loc_at(const Parser *P, const char *at) {
  return (Loc){P->src, P->line, (int)(at - P->bol) + 1};
}

#define FAIL(at, ...) fail_loc(P, loc_at(P, (at)), __VA_ARGS__)

static const char *skip_ws(const Parser *P, const char *q) {
  while (q < P->eol && (*q == ' ' || *q == '\t')) q++;
  return q;
}

static void ws(Parser *P) { P->p = skip_ws(P, P->p); }

static bool at_eol(Parser *P) {
  ws(P);
  return P->p >= P->eol || *P->p == '#';
}

static bool word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The token at the cursor, quoted, for "found ..." in messages. */
static const char *found(Parser *P) {
  const char *q = skip_ws(P, P->p), *e = q;
  if (q >= P->eol || *q == '#') return "end of line";
  if (*e == '%' || *e == '$' || *e == '@') e++;
  while (e < P->eol && (word_char(*e) || *e == '.')) e++;
  if (e == q || (e == q + 1 && !word_char(*q)))
    for (e = q + 1; e < P->eol && ((unsigned char)*e & 0xC0) == 0x80; e++) {
    }
  int n = (int)(e - q) > 40 ? 40 : (int)(e - q);
  char *s = arena_printf(P->a, "'%.*s%s'", n, q, e - q > 40 ? "..." : "");
  for (char *c = s; *c; c++)
    if ((unsigned char)*c < 0x20 || *c == 0x7F) *c = '?';
  return s;
}

/* ------------------------------------------------------------- hints */


/* " (did you mean `x`?)" for the closest candidate within 1 edit (names of
 * up to 3 characters) or 2, else "". */
static const char *hint(Parser *P, const char *want, const char *const *cands, int n) {
  const char *best = NULL;
  int best_d = strlen(want) <= 3 ? 1 : 2;
  for (int i = 0; i < n; i++) {
    int d = cands[i] ? ir_edit_distance(want, cands[i]) : 99;
    if (d <= best_d && (!best || d < best_d)) best = cands[i], best_d = d;
  }
  return best ? arena_printf(P->a, " (did you mean `%s`?)", best) : "";
}

static const char *op_hint(Parser *P, const char *want) {
  const char *names[OP_COUNT];
  for (int i = 0; i < OP_COUNT; i++) names[i] = op_info[i].name;
  return hint(P, want, names, OP_COUNT);
}

/* ------------------------------------------------------------ tokens */

static bool accept(Parser *P, char c) {
  ws(P);
  if (P->p < P->eol && *P->p == c) {
    P->p++;
    return true;
  }
  return false;
}

static void expect(Parser *P, char c, const char *what) {
  if (!accept(P, c)) FAIL(P->p, "expected %s, found %s", what, found(P));
}

static bool peek(Parser *P, char c) {
  ws(P);
  return P->p < P->eol && *P->p == c;
}

/* An identifier [A-Za-z_][A-Za-z0-9_]*, copied into the arena; NULL (cursor
 * unmoved) when there is none. */
static const char *word(Parser *P) {
  ws(P);
  const char *q = P->p;
  if (q >= P->eol || !(isalpha((unsigned char)*q) || *q == '_')) return NULL;
  while (q < P->eol && word_char(*q)) q++;
  const char *w = arena_printf(P->a, "%.*s", (int)(q - P->p), P->p);
  P->p = q;
  return w;
}

static const char *want_word(Parser *P, const char *what) {
  const char *w = word(P);
  if (!w) FAIL(P->p, "expected %s, found %s", what, found(P));
  return w;
}

static void want_eol(Parser *P, const char *after) {
  if (!at_eol(P)) FAIL(P->p, "unexpected %s after %s", found(P), after);
}

static int64_t integer(Parser *P, int64_t lo, int64_t hi, const char *what) {
  ws(P);
  const char *q = P->p, *s = q;
  if (q < P->eol && *q == '-') q++;
  if (q >= P->eol || !isdigit((unsigned char)*q)) FAIL(s, "expected %s (an integer), found %s", what, found(P));
  while (q < P->eol && isdigit((unsigned char)*q)) q++;
  char buf[32];
  if (q - s > 24) FAIL(s, "%s is out of range", what);
  memcpy(buf, s, (size_t)(q - s));
  buf[q - s] = 0;
  errno = 0;
  long long v = strtoll(buf, NULL, 10);
  if (errno || v < lo || v > hi) {
    if (hi == INT64_MAX) FAIL(s, "%s must be at least %" PRId64 ", got %s", what, lo, buf);
    FAIL(s, "%s must be in [%" PRId64 ", %" PRId64 "], got %s", what, lo, hi, buf);
  }
  P->p = q;
  return v;
}

/* A number follows: a digit, a sign or a point, or the words inf, nan. */
static bool number_start(Parser *P) {
  ws(P);
  if (P->p >= P->eol) return false;
  char c = *P->p;
  if (isdigit((unsigned char)c) || c == '.' || c == '-' || c == '+') return true;
  const char *e = P->p;
  while (e < P->eol && word_char(*e)) e++;
  size_t n = (size_t)(e - P->p);
  return (n == 3 && (!strncmp(P->p, "inf", 3) || !strncmp(P->p, "nan", 3))) || (n == 8 && !strncmp(P->p, "infinity", 8));
}

/* A real number as strtod reads it (decimal, hex, inf, nan): exact. */
static double number(Parser *P, const char *what) {
  ws(P);
  const char *s = P->p, *q = s;
  while (q < P->eol && q - s < 64) {
    char c = *q;
    bool sign_ok = q == s || q[-1] == 'e' || q[-1] == 'E' || q[-1] == 'p' || q[-1] == 'P';
    if (word_char(c) || c == '.' || ((c == '-' || c == '+') && sign_ok)) q++;
    else break;
  }
  char buf[72];
  memcpy(buf, s, (size_t)(q - s));
  buf[q - s] = 0;
  char *end;
  double x = q > s ? strtod(buf, &end) : 0;
  if (q == s || *end) FAIL(s, "expected %s (a number), found %s", what, found(P));
  P->p = q;
  return x;
}

/* "..." with \" \\ \n \t \xHH escapes. */
static const char *string(Parser *P, const char *what) {
  ws(P);
  const char *s = P->p;
  if (s >= P->eol || *s != '"') FAIL(s, "expected %s (a string in quotes), found %s", what, found(P));
  char *out = arena_alloc(P->a, (size_t)(P->eol - s) + 1);
  size_t n = 0;
  const char *q = s + 1;
  for (;; q++) {
    if (q >= P->eol) FAIL(s, "unterminated string");
    if (*q == '"') break;
    if (*q != '\\') {
      out[n++] = *q;
      continue;
    }
    q++;
    if (q >= P->eol) FAIL(s, "unterminated string");
    if (*q == 'n') out[n++] = '\n';
    else if (*q == 't') out[n++] = '\t';
    else if (*q == '"' || *q == '\\') out[n++] = *q;
    else if (*q == 'x' && q + 2 < P->eol && isxdigit((unsigned char)q[1]) && isxdigit((unsigned char)q[2])) {
      char h[3] = {q[1], q[2], 0};
      out[n++] = (char)strtol(h, NULL, 16);
      q += 2;
    } else {
      FAIL(q - 1, "unknown escape '\\%c' in a string (use \\\" \\\\ \\n \\t or \\xHH)", *q);
    }
    if (out[n - 1] == 0) FAIL(q - 1, "a string cannot contain a NUL byte");
  }
  out[n] = 0;
  P->p = q + 1;
  return out;
}

/* [d0,d1,...] with every dimension at least 1. */
static Shape shape(Parser *P, const char *what) {
  Shape s = {0};
  expect(P, '[', what);
  if (accept(P, ']')) return s;
  do {
    if (s.rank == IR_MAX_RANK) FAIL(P->p, "more than %d dimensions", IR_MAX_RANK);
    s.dim[s.rank++] = integer(P, 1, INT64_MAX, "a dimension");
  } while (accept(P, ','));
  expect(P, ']', "',' or ']' in the shape");
  return s;
}

static void type(Parser *P, DType *dt, Shape *s) {
  const char *at = skip_ws(P, P->p);
  const char *w = word(P);
  memset(s, 0, sizeof *s);
  if (w && !strcmp(w, "void")) {
    *dt = DT_VOID;
    return;
  }
  int t = w ? dtype_from_name(w) : -1;
  if (t < 0) {
    P->p = at;
    FAIL(at, "expected a type (f32[...], f64[...], i32[...], f16[...], bf16[...] or void), found %s", found(P));
  }
  *dt = (DType)t;
  *s = shape(P, "'[' and the dimensions of the type");
}

/* --------------------------------------------------------- %id table */

static size_t slot_of(const Parser *P, int64_t id) {
  size_t h = (size_t)((uint64_t)id * 0x9E3779B97F4A7C15u >> 17);
  for (size_t i = h & (P->cap - 1);; i = (i + 1) & (P->cap - 1))
    if (P->slots[i].id == id || P->slots[i].id < 0) return i;
}

/* The line after the current one that defines %id, or 0. */
static int defined_later(const Parser *P, int64_t id) {
  const char *q = P->eol, *end = P->src->text + P->src->len;
  int line = P->line;
  char want[32];
  int n = snprintf(want, sizeof want, "%%%" PRId64, id);
  while (q < end) {
    q += (*q == '\r' && q + 1 < end && q[1] == '\n') ? 2 : 1;
    line++;
    while (q < end && (*q == ' ' || *q == '\t')) q++;
    if (end - q > n && !strncmp(q, want, (size_t)n) && !isdigit((unsigned char)q[n])) {
      const char *r = q + n;
      while (r < end && (*r == ' ' || *r == '\t')) r++;
      if (r < end && *r == '=') return line;
    }
    while (q < end && *q != '\n' && *q != '\r') q++;
  }
  return 0;
}

/* %ID at the cursor, defined on an earlier line. */
static Value *ref(Parser *P) {
  ws(P);
  const char *at = P->p;
  if (!accept(P, '%')) FAIL(at, "expected a value `%%N`, found %s", found(P));
  if (P->p >= P->eol || !isdigit((unsigned char)*P->p)) FAIL(at, "expected a value id after '%%', found %s", found(P));
  int64_t id = integer(P, 0, INT32_MAX, "a value id");
  IdSlot *s = &P->slots[slot_of(P, id)];
  if (id == P->cur_id) FAIL(at, "%%%" PRId64 " is used in its own definition", id);
  if (s->id < 0) {
    int later = defined_later(P, id);
    if (later) FAIL(at, "%%%" PRId64 " is used before its definition on line %d", id, later);
    FAIL(at, "%%%" PRId64 " is not defined", id);
  }
  return s->v;
}

/* ------------------------------------------------------- attributes */

enum { AK_INT, AK_NUM, AK_FLAG, AK_PAIR };
#define ATTR_INT_MAX ((int64_t)1 << 40) /* bounds sums of attributes and dims */
typedef struct AKey {
  const char *name;
  int kind;
  bool required;
} AKey;
typedef struct AVals {
  bool set[8];
  int64_t i[8][2];
  double x[8];
} AVals;

/* [key=value, flag, ...] in any order, each at most once.  Returns the
 * position of the closing ']' (for "missing" errors). */
static void attr_list(Parser *P, const char *opname, const AKey *keys, int nk, AVals *out) {
  memset(out, 0, sizeof *out);
  expect(P, '[', "'[' and the attributes");
  const char *close = P->p;
  if (!accept(P, ']')) {
    do {
      ws(P);
      const char *at = P->p;
      const char *w = word(P);
      int k = 0;
      while (w && k < nk && strcmp(keys[k].name, w)) k++;
      if (!w || k == nk) {
        char list[200] = "";
        for (int j = 0; j < nk; j++)
          snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", j ? ", " : "", keys[j].name);
        if (!w) FAIL(at, "expected an attribute of %s (%s), found %s", opname, list, found(P));
        const char *names[8];
        for (int j = 0; j < nk; j++) names[j] = keys[j].name;
        FAIL(at, "unknown attribute `%s` of %s%s; its attributes: %s", w, opname, hint(P, w, names, nk), list);
      }
      if (out->set[k]) FAIL(at, "attribute `%s` is given twice", w);
      out->set[k] = true;
      if (keys[k].kind == AK_FLAG) {
        if (peek(P, '=')) FAIL(P->p, "`%s` is a flag and takes no value", w);
        continue;
      }
      expect(P, '=', arena_printf(P->a, "'=' after `%s`", w));
      if (keys[k].kind == AK_NUM) {
        out->x[k] = number(P, arena_printf(P->a, "the value of `%s`", w));
      } else {
        out->i[k][0] = integer(P, -ATTR_INT_MAX, ATTR_INT_MAX, arena_printf(P->a, "the value of `%s`", w));
        if (keys[k].kind == AK_PAIR) {
          if (P->p >= P->eol || *P->p != 'x') FAIL(P->p, "expected `x` and a second integer (as in %s=3x3), found %s", w, found(P));
          P->p++;
          out->i[k][1] = integer(P, -ATTR_INT_MAX, ATTR_INT_MAX, arena_printf(P->a, "the value of `%s`", w));
        }
      }
    } while (accept(P, ','));
    close = P->p;
    expect(P, ']', arena_printf(P->a, "',' or ']' in the attributes of %s", opname));
  }
  for (int k = 0; k < nk; k++)
    if (keys[k].required && !out->set[k]) FAIL(close, "%s needs the attribute `%s`", opname, keys[k].name);
}

static void no_attrs(Parser *P, const char *opname) {
  if (peek(P, '[') || peek(P, '{')) FAIL(P->p, "%s takes no attributes", opname);
}

static int init_from_name(const char *w) {
  for (int k = 0; k < INIT_COUNT; k++)
    if (!strcmp(init_name((InitKind)k), w)) return k;
  return -1;
}

/* A fused load `inK` whose K is checked once the operands are known. */
typedef struct Load {
  const char *at;
  int line_k; /* instruction index */
} Load;

static void window_attrs(Parser *P, const char *opname, Attr *at) {
  static const AKey keys[] = {{"k", AK_PAIR, true}, {"s", AK_PAIR, true}, {"p", AK_PAIR, true}, {"d", AK_PAIR, true}};
  AVals v;
  const char *start = skip_ws(P, P->p);
  attr_list(P, opname, keys, 4, &v);
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < 2; j++) {
      int64_t lo = k == 2 ? 0 : 1;
      if (v.i[k][j] < lo || v.i[k][j] > (1 << 20))
        FAIL(start, "%s: %s=%" PRId64 "x%" PRId64 " is out of range (%s)", opname, keys[k].name, v.i[k][0], v.i[k][1],
             k == 2 ? "padding 0 to 2^20" : "1 to 2^20");
    }
  at->kh = v.i[0][0], at->kw = v.i[0][1], at->sh = v.i[1][0], at->sw = v.i[1][1];
  at->ph = v.i[2][0], at->pw = v.i[2][1], at->dh = v.i[3][0], at->dw = v.i[3][1];
}

static void dropout_attrs(Parser *P, const char *opname, double *p, int64_t *site) {
  static const AKey keys[] = {{"p", AK_NUM, true}, {"site", AK_INT, true}};
  AVals v;
  const char *start = skip_ws(P, P->p);
  attr_list(P, opname, keys, 2, &v);
  if (!(v.x[0] >= 0 && v.x[0] < 1)) FAIL(start, "dropout probability p must be in [0, 1), got %g", v.x[0]);
  if (v.i[1][0] < 0 || v.i[1][0] > INT32_MAX) FAIL(start, "dropout site must be in [0, 2^31), got %" PRId64, v.i[1][0]);
  *p = v.x[0];
  *site = v.i[1][0];
}

/* The target of a fused cast: `[f16]`. */
static DType cast_attr(Parser *P) {
  expect(P, '[', "'[' and the target dtype of cast");
  ws(P);
  const char *at = P->p;
  const char *w = want_word(P, "a float dtype (f32, f64, f16, bf16)");
  int t = dtype_from_name(w);
  if (t < 0 || !dtype_is_float((DType)t)) FAIL(at, "cast to `%s`: expected a float dtype (f32, f64, f16, bf16)", w);
  expect(P, ']', "']' after the dtype of cast");
  return (DType)t;
}

/* {$0 = in0; $1 = 2; $2 = mul $0, $1; ...} */
static FusedProg *fused_prog(Parser *P, Load **loads_out, int *n_loads_out) {
  const char *open = skip_ws(P, P->p);
  expect(P, '{', "'{' and the fused program");
  int cap = 16, n = 0, n_loads = 0;
  FusedInstr *ins = arena_alloc(P->a, (size_t)cap * sizeof *ins);
  Load *loads = arena_alloc(P->a, (size_t)cap * sizeof *loads);
  if (peek(P, '}')) FAIL(P->p, "empty fused program");
  do {
    if (n == FUSE_MAX_INSTRS) FAIL(open, "fused program longer than %d instructions", FUSE_MAX_INSTRS);
    if (n == cap) {
      FusedInstr *ni = arena_alloc(P->a, (size_t)cap * 2 * sizeof *ni);
      Load *nl = arena_alloc(P->a, (size_t)cap * 2 * sizeof *nl);
      memcpy(ni, ins, (size_t)n * sizeof *ni);
      memcpy(nl, loads, (size_t)n_loads * sizeof *nl);
      ins = ni, loads = nl, cap *= 2;
    }
    ws(P);
    const char *at = P->p;
    if (!accept(P, '$') || P->p >= P->eol || !isdigit((unsigned char)*P->p))
      FAIL(at, "expected $%d (fused instructions are numbered from $0 in order), found %s", n, found(P));
    int64_t k = integer(P, 0, INT32_MAX, "an instruction number");
    if (k != n) FAIL(at, "expected $%d (fused instructions are numbered from $0 in order), found $%" PRId64, n, k);
    expect(P, '=', arena_printf(P->a, "'=' after $%d", n));
    FusedInstr fi = {.op = OP_COUNT};
    ws(P);
    const char *opat = P->p;
    if (number_start(P)) {
      fi.op = OP_CONST;
      fi.value = number(P, "a constant");
    } else {
      const char *w = want_word(P, "`inK`, a number or an elementwise op");
      if (!strncmp(w, "in", 2) && w[2] && strspn(w + 2, "0123456789") == strlen(w + 2)) {
        if (strlen(w) > 8) FAIL(opat, "fused input `%s` is out of range", w);
        fi.a = atoi(w + 2);
        loads[n_loads++] = (Load){opat, n};
      } else {
        int op = op_from_name(w);
        if (op < 0) FAIL(opat, "unknown op `%s` in a fused program%s", w, op_hint(P, w));
        if (!(op_info[op].flags & OPF_EW) || op == OP_FUSED || op == OP_CONST)
          FAIL(opat, "`%s` cannot appear in a fused program (only elementwise ops; constants are written as numbers)", w);
        fi.op = (OpKind)op;
        if (op == OP_DROPOUT) dropout_attrs(P, w, &fi.value, &fi.site);
        else if (op == OP_CAST) fi.site = cast_attr(P);
        else no_attrs(P, w);
        for (int j = 0; j < op_info[op].arity; j++) {
          if (j) expect(P, ',', arena_printf(P->a, "',' and the second operand of %s", w));
          ws(P);
          const char *ra = P->p;
          if (!accept(P, '$') || P->p >= P->eol || !isdigit((unsigned char)*P->p))
            FAIL(ra, "expected an instruction operand `$K` of %s, found %s", w, found(P));
          int64_t r = integer(P, 0, INT32_MAX, "an instruction number");
          if (r >= n) FAIL(ra, "$%" PRId64 " is not computed before $%d", r, n);
          if (j) fi.b = (int)r;
          else fi.a = (int)r;
        }
      }
    }
    ins[n++] = fi;
  } while (accept(P, ';'));
  expect(P, '}', "';' or '}' in the fused program");
  FusedProg *prog = arena_alloc(P->a, sizeof *prog);
  prog->n = n;
  prog->ins = ins;
  *loads_out = loads;
  *n_loads_out = n_loads;
  return prog;
}

/* The attributes between an op's name and its operands, as ir_print writes
 * them.  Sets *attr_shape when the attributes include the result shape. */
static void op_attrs(Parser *P, OpKind op, Attr *at, bool *attr_shape, Load **loads, int *n_loads) {
  const char *name = op_info[op].name;
  const char *start = skip_ws(P, P->p);
  AVals v;
  switch (op) {
  case OP_INPUT:
  case OP_STATE:
    at->name = string(P, "the tensor name");
    if (!*at->name) FAIL(start, "empty tensor name");
    if (op == OP_STATE) {
      const char *q = P->p;
      const char *w = word(P);
      if (w && !strcmp(w, "kv_cache")) at->kv_cache = true;
      else if (w && !strcmp(w, "ones")) at->init = INIT_ONES; /* a pruning mask */
      else P->p = q;
    }
    break;
  case OP_PARAM: {
    at->name = string(P, "the parameter name");
    if (!*at->name) FAIL(start, "empty tensor name");
    ws(P);
    const char *ia = P->p;
    const char *w = want_word(P, "an initialiser (zeros, ones, normal(std), uniform(a, b), kaiming_uniform, xavier_uniform)");
    int k = init_from_name(w);
    if (k < 0) {
      const char *names[INIT_COUNT];
      for (int i = 0; i < INIT_COUNT; i++) names[i] = init_name((InitKind)i);
      FAIL(ia, "unknown initialiser `%s`%s (zeros, ones, normal, uniform, kaiming_uniform, xavier_uniform)", w,
           hint(P, w, names, INIT_COUNT));
    }
    at->init = (InitKind)k;
    at->init_a = k == INIT_NORMAL ? 1.0 : 0.0; /* the .model defaults */
    at->init_b = k == INIT_UNIFORM ? 1.0 : 0.0;
    if ((k == INIT_NORMAL || k == INIT_UNIFORM) && accept(P, '(')) {
      at->init_a = number(P, k == INIT_NORMAL ? "the standard deviation" : "the lower bound");
      if (k == INIT_UNIFORM) {
        expect(P, ',', "',' and the upper bound of uniform");
        at->init_b = number(P, "the upper bound");
      }
      expect(P, ')', "')'");
    }
    if (k == INIT_NORMAL && !(isfinite(at->init_a) && at->init_a >= 0))
      FAIL(ia, "normal(std): std must be a finite number >= 0, got %s", ir_num_str(at->init_a, (char[32]){0}, 32));
    if (k == INIT_UNIFORM && !(isfinite(at->init_a) && isfinite(at->init_b) && at->init_a < at->init_b))
      FAIL(ia, "uniform(a, b) needs finite a < b, got (%s, %s)", ir_num_str(at->init_a, (char[32]){0}, 32),
           ir_num_str(at->init_b, (char[32]){0}, 32));
    break;
  }
  case OP_CONST:
    at->value = number(P, "the constant's value");
    break;
  case OP_MATMUL:
  case OP_MATMUL_I8:
    if (peek(P, '[')) {
      static const AKey keys[] = {{"ta", AK_FLAG, false}, {"tb", AK_FLAG, false}};
      attr_list(P, name, keys, 2, &v);
      at->trans_a = v.set[0];
      at->trans_b = v.set[1];
    }
    break;
  case OP_BROADCAST:
  case OP_SUM_TO:
  case OP_MAX_TO:
  case OP_MAX_TO_GRAD:
  case OP_EMBEDDING_GRAD:
  case OP_RESHAPE:
    at->shape = shape(P, arena_printf(P->a, "'[' and the result shape of %s", name));
    *attr_shape = true;
    break;
  case OP_ATTENTION:
  case OP_ATTENTION_GRAD:
  case OP_ATTENTION_DECODE: {
    static const AKey keys[] = {{"heads", AK_INT, true}, {"kv_heads", AK_INT, false}, {"causal", AK_FLAG, false}};
    attr_list(P, name, keys, 3, &v);
    if (v.i[0][0] < 1) FAIL(start, "%s: heads must be at least 1, got %" PRId64, name, v.i[0][0]);
    if (v.set[1] && (v.i[1][0] < 1 || v.i[0][0] % v.i[1][0]))
      FAIL(start, "%s: kv_heads %" PRId64 " does not divide heads %" PRId64, name, v.i[1][0], v.i[0][0]);
    at->heads = v.i[0][0];
    at->kv_heads = v.set[1] && v.i[1][0] != v.i[0][0] ? v.i[1][0] : 0; /* as many as heads: 0 */
    at->causal = v.set[2];
    break;
  }
  case OP_ROPE:
  case OP_ROPE_GRAD: {
    static const AKey keys[] = {{"heads", AK_INT, true}, {"base", AK_NUM, true}};
    attr_list(P, name, keys, 2, &v);
    if (v.i[0][0] < 1) FAIL(start, "%s: heads must be at least 1, got %" PRId64, name, v.i[0][0]);
    if (!(v.x[1] > 0) || !isfinite(v.x[1])) FAIL(start, "%s: base must be a finite number above 0", name);
    at->heads = v.i[0][0];
    at->base = v.x[1];
    break;
  }
  case OP_SOFTMAX:
  case OP_SOFTMAX_GRAD: {
    static const AKey keys[] = {{"axis", AK_INT, true}};
    attr_list(P, name, keys, 1, &v);
    if (v.i[0][0] < 0 || v.i[0][0] >= IR_MAX_RANK) FAIL(start, "%s: axis %" PRId64 " is out of range", name, v.i[0][0]);
    at->axis = (int)v.i[0][0];
    break;
  }
  case OP_SLICE:
  case OP_SLICE_GRAD: {
    static const AKey keys[] = {{"axis", AK_INT, true}, {"start", AK_INT, true}, {"squeeze", AK_FLAG, false}};
    attr_list(P, name, keys, 3, &v);
    if (v.i[0][0] < 0 || v.i[0][0] >= IR_MAX_RANK) FAIL(start, "%s: axis %" PRId64 " is out of range", name, v.i[0][0]);
    if (v.i[1][0] < 0) FAIL(start, "%s: start must be at least 0, got %" PRId64, name, v.i[1][0]);
    at->axis = (int)v.i[0][0];
    at->index = v.i[1][0];
    at->squeeze = v.set[2];
    at->shape = shape(P, arena_printf(P->a, "'[' and the result shape of %s", name));
    *attr_shape = true;
    break;
  }
  case OP_CONCAT: {
    static const AKey keys[] = {{"axis", AK_INT, true}};
    attr_list(P, name, keys, 1, &v);
    if (v.i[0][0] < 0 || v.i[0][0] >= IR_MAX_RANK) FAIL(start, "%s: axis %" PRId64 " is out of range", name, v.i[0][0]);
    at->axis = (int)v.i[0][0];
    at->shape = shape(P, "'[' and the result shape of concat");
    *attr_shape = true;
    break;
  }
  case OP_PERMUTE: {
    expect(P, '[', "'[' and the axes of permute");
    int r = 0;
    do {
      if (r == IR_MAX_RANK) FAIL(P->p, "more than %d axes", IR_MAX_RANK);
      at->perm[r++] = (int)integer(P, 0, IR_MAX_RANK - 1, "an axis");
    } while (accept(P, ','));
    expect(P, ']', "',' or ']' in the axes of permute");
    at->shape.rank = r; /* the dims come from the type */
    break;
  }
  case OP_IM2COL: case OP_COL2IM: case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_AVGPOOL: case OP_AVGPOOL_GRAD:
    window_attrs(P, name, at);
    break;
  case OP_DROPOUT:
    dropout_attrs(P, name, &at->p, &at->site);
    break;
  case OP_NORM:
  case OP_NORM_GRAD:
  case OP_RMS_NORM:
  case OP_RMS_NORM_GRAD: {
    static const AKey keys[] = {{"eps", AK_NUM, true}};
    attr_list(P, name, keys, 1, &v);
    if (!(v.x[0] >= 0) || !isfinite(v.x[0])) FAIL(start, "%s: eps must be a finite number >= 0", name);
    at->eps = v.x[0];
    break;
  }
  case OP_ADAMW:
  case OP_SGD:
    if (peek(P, '[')) {
      static const AKey keys[] = {{"no_decay", AK_FLAG, false}, {"shard", AK_INT, false}};
      attr_list(P, name, keys, 2, &v);
      at->no_decay = v.set[0];
      if (v.set[1] && (v.i[1][0] < 0 || v.i[1][0] >= IR_MAX_REPLICAS))
        FAIL(start, "%s: shard must be in [0, %d), got %" PRId64, name, IR_MAX_REPLICAS, v.i[1][0]);
      at->sharded = v.set[1];
      at->shard = (int)v.i[1][0];
    }
    break;
  case OP_FUSED:
    at->prog = fused_prog(P, loads, n_loads);
    break;
  case OP_ALL_GATHER: {
    static const AKey keys[] = {{"bucket", AK_INT, true}};
    attr_list(P, name, keys, 1, &v);
    if (v.i[0][0] < 0 || v.i[0][0] > INT32_MAX) FAIL(start, "all_gather: bucket must be in [0, 2^31), got %" PRId64, v.i[0][0]);
    at->bucket = (int)v.i[0][0];
    break;
  }
  case OP_REDUCE_SCATTER:
  case OP_ALLREDUCE: {
    static const AKey keys[] = {{"bucket", AK_INT, true}, {"bytes", AK_INT, true}};
    attr_list(P, name, keys, 2, &v);
    if (v.i[0][0] < 0 || v.i[0][0] > INT32_MAX) FAIL(start, "allreduce: bucket must be in [0, 2^31), got %" PRId64, v.i[0][0]);
    if (v.i[1][0] < 1) FAIL(start, "allreduce: bytes must be at least 1, got %" PRId64, v.i[1][0]);
    at->bucket = (int)v.i[0][0];
    at->bytes = v.i[1][0];
    break;
  }
  case OP_PRUNE_MASK:
    at->axis = -1;
    if (peek(P, '[')) {
      static const AKey keys[] = {{"out", AK_INT, true}};
      attr_list(P, name, keys, 1, &v);
      if (v.i[0][0] < 0 || v.i[0][0] >= IR_MAX_RANK) FAIL(start, "prune_mask: out axis %" PRId64 " is out of range", v.i[0][0]);
      at->axis = (int)v.i[0][0];
    }
    break;
  case OP_UNSCALE: {
    static const AKey keys[] = {{"slot", AK_INT, true}};
    attr_list(P, name, keys, 1, &v);
    if (v.i[0][0] < 0 || v.i[0][0] > INT32_MAX) FAIL(start, "unscale: slot must be in [0, 2^31), got %" PRId64, v.i[0][0]);
    at->slot = (int)v.i[0][0];
    break;
  }
  default:
    no_attrs(P, name);
    break;
  }
}

/* ------------------------------------------------------ value checks */

#define SHP(s) shape_str((s), (char[160]){0}, 160)

/* Output extent of a window along one axis; fails when below 1. */
static int64_t window_out(Parser *P, const char *at, const char *name, int64_t n, int64_t k, int64_t s, int64_t p,
                          int64_t d) {
  int64_t num = n + 2 * p - d * (k - 1) - 1;
  if (num < 0) FAIL(at, "%s: the window (kernel %" PRId64 ", dilation %" PRId64 ") is larger than the padded input (%" PRId64 ")",
                    name, k, d, n + 2 * p);
  return num / s + 1;
}

/* What the shape rules of ir_infer_shape leave to the frontend: operands and
 * attributes consistent with the declared result, so that lowering never
 * indexes outside a tensor. */
static void check_value(Parser *P, const char *at, OpKind op, Value **in, int n, const Attr *a, DType dt,
                        const Shape *s) {
  const char *name = op_info[op].name;
  const Shape *x = n ? &in[0]->shape : NULL;
  switch (op) {
  case OP_PARAM:
  case OP_STATE: /* a state may also hold 8-bit AdamW codes (u8), a param int8 weights (i8: quantize) */
    if (!dtype_is_float(dt) && !(op == OP_STATE && dt == DT_U8) && !(op == OP_PARAM && dt == DT_I8))
      FAIL(at, "%s `%s` must be a float tensor, not %s", name, a->name, dtype_name(dt));
    break;
  case OP_ADAMW: {
    const char *why = ir_adamw_operands_error(in, n);
    if (why) FAIL(at, "adamw_update %s", why);
    break;
  }
  case OP_SLICE:
  case OP_SLICE_GRAD: {
    const Shape *full = op == OP_SLICE ? x : s, *part = op == OP_SLICE ? s : x;
    int ax = a->axis;
    bool ok = ax < full->rank && part->rank == full->rank - (a->squeeze ? 1 : 0);
    int64_t len = ok ? (a->squeeze ? 1 : part->dim[ax]) : 0;
    for (int d = 0, e = 0; ok && d < full->rank; d++) {
      if (d == ax && a->squeeze) continue;
      if (d != ax && part->dim[e] != full->dim[d]) ok = false;
      e++;
    }
    if (!ok || a->index + len > full->dim[ax])
      FAIL(at, "%s of %s along axis %d from %" PRId64 " giving %s: out of bounds, or the other dimensions differ", name,
           SHP(full), ax, a->index, SHP(part));
    break;
  }
  case OP_CONCAT: {
    if (n > 32) FAIL(at, "concat of more than 32 operands");
    int64_t sum = 0;
    for (int j = 0; j < n; j++) {
      Shape t = in[j]->shape, u = *s;
      if (a->axis >= u.rank || t.rank != u.rank) FAIL(at, "concat of %s into %s along axis %d: ranks differ", SHP(&t), SHP(&u), a->axis);
      sum += t.dim[a->axis];
      t.dim[a->axis] = u.dim[a->axis] = 1;
      if (!shape_eq(&t, &u))
        FAIL(at, "concat of %s into %s along axis %d: the other dimensions differ", SHP(&in[j]->shape), SHP(s), a->axis);
    }
    if (sum != s->dim[a->axis])
      FAIL(at, "concat along axis %d: the operands have %" PRId64 " positions, the result %" PRId64, a->axis, sum,
           s->dim[a->axis]);
    break;
  }
  case OP_PERMUTE: {
    unsigned seen = 0;
    bool ok = a->shape.rank == s->rank && x->rank == s->rank;
    for (int d = 0; ok && d < s->rank; d++) {
      ok = !(seen & (1u << a->perm[d])) && a->perm[d] < s->rank && s->dim[d] == x->dim[a->perm[d]];
      seen |= 1u << a->perm[d];
    }
    if (!ok) FAIL(at, "permute of %s to %s: the axes are not a permutation that gives the result", SHP(x), SHP(s));
    break;
  }
  case OP_IM2COL: case OP_COL2IM: case OP_MAXPOOL: case OP_MAXPOOL_GRAD: case OP_AVGPOOL: case OP_AVGPOOL_GRAD: {
    /* the [N,C,H,W] side: the operand of the forward ops, the result of the backward ones */
    bool fwd = op == OP_IM2COL || op == OP_MAXPOOL || op == OP_AVGPOOL;
    const Shape *img = fwd ? x : s, *other = fwd ? s : x;
    if (img->rank != 4) FAIL(at, "%s expects an image of rank 4 [N,C,H,W], got %s", name, SHP(img));
    if (op == OP_MAXPOOL_GRAD && !shape_eq(&in[1]->shape, s))
      FAIL(at, "max_pool2d_grad: the input %s and the result %s differ", SHP(&in[1]->shape), SHP(s));
    int64_t oh = window_out(P, at, name, img->dim[2], a->kh, a->sh, a->ph, a->dh);
    int64_t ow = window_out(P, at, name, img->dim[3], a->kw, a->sw, a->pw, a->dw);
    Shape want = *img;
    if (op == OP_IM2COL || op == OP_COL2IM)
      want = (Shape){.rank = 2, .dim = {img->dim[0] * oh * ow, img->dim[1] * a->kh * a->kw}};
    else
      want.dim[2] = oh, want.dim[3] = ow;
    if (!shape_eq(&want, other))
      FAIL(at, "%s of an image %s with these windows needs %s, got %s", name, SHP(img), SHP(&want), SHP(other));
    break;
  }
  case OP_EMBEDDING_GRAD: {
    const Shape *dy = &in[0]->shape, *ix = &in[1]->shape;
    Shape want = *ix;
    bool ok = in[1]->dtype == DT_I32 && dtype_is_float(in[0]->dtype) && dt == in[0]->dtype && s->rank == 2 &&
              ix->rank < IR_MAX_RANK;
    if (ok) want.dim[want.rank++] = s->dim[1];
    if (!ok || !shape_eq(&want, dy))
      FAIL(at, "embedding_grad of %s%s by indices %s%s into %s: expected gradients %s and i32 indices", dtype_name(in[0]->dtype),
           SHP(dy), dtype_name(in[1]->dtype), SHP(ix), SHP(s), SHP(&want));
    break;
  }
  case OP_ATTENTION_GRAD: {
    /* dy, q [B,T,C], k, v [B,T,C K/H]; the result packs dq, dk, dv:
     * [3,B,T,C] (K = H), or [B,T,C + 2 C K/H] along the channels (K < H) */
    int64_t H = a->heads, K = ir_kv_heads(a);
    bool heads_ok = H >= 1 && K >= 1 && H % K == 0 && x->rank == 3 && x->dim[2] % H == 0;
    Shape kv = *x, want = {.rank = x->rank + 1, .dim = {3}};
    if (heads_ok) kv.dim[2] = x->dim[2] / H * K;
    if (K == H)
      for (int d = 0; d < x->rank && d + 1 < IR_MAX_RANK; d++) want.dim[d + 1] = x->dim[d];
    else if (heads_ok)
      want = *x, want.dim[2] = x->dim[2] + 2 * kv.dim[2];
    for (int j = 1; j < 4; j++)
      if (!shape_eq(&in[j]->shape, j == 1 ? x : &kv) || in[j]->dtype != in[0]->dtype)
        FAIL(at, "attention_grad: operand %d is %s%s, expected %s%s", j + 1, dtype_name(in[j]->dtype),
             SHP(&in[j]->shape), dtype_name(in[0]->dtype), SHP(j == 1 ? x : &kv));
    if (!heads_ok || !shape_eq(&want, s) || dt != in[0]->dtype || !dtype_is_float(dt))
      FAIL(at, "attention_grad of %s with %" PRId64 " heads%s gives %s%s (packed dq, dk, dv%s)", SHP(x), a->heads,
           K == H ? "" : arena_printf(P->a, " and %" PRId64 " kv_heads", K), dtype_name(in[0]->dtype), SHP(&want),
           K == H ? "" : " along the channels");
    break;
  }
  case OP_ATTENTION_DECODE:
    for (int j = 3; j < 5; j++) {
      const Shape *c = &in[j]->shape, *k = &in[1]->shape; /* the caches hold keys and values */
      if (x->rank != 3 || k->rank != 3 || c->rank != 3 || c->dim[0] != x->dim[0] || c->dim[2] != k->dim[2] ||
          in[j]->dtype != in[0]->dtype)
        FAIL(at, "attention_decode: cache %s does not fit k %s ([batch, context, channels])", SHP(c), SHP(k));
    }
    break;
  case OP_PRUNE_MASK: {
    if (n < 2 || n > 4) FAIL(at, "prune_mask takes 2 to 4 operands (param, mask, optimizer state), got %d", n);
    bool ok = in[0]->op == OP_PARAM && in[1]->op == OP_STATE && in[1]->attr.init == INIT_ONES;
    for (int j = 1; j < n; j++)
      ok = ok && in[j]->op == OP_STATE && !in[j]->attr.kv_cache &&
           (in[j]->dtype == in[0]->dtype || (j >= 2 && in[j]->dtype == DT_U8)) &&
           shape_numel(&in[j]->shape) == shape_numel(&in[0]->shape);
    if (!ok)
      FAIL(at, "prune_mask: expected a param, its mask (a state initialised to ones) and its optimizer state, all of "
               "the param's dtype (or 8-bit AdamW codes)");
    if (a->axis >= 0 && a->axis != 0 && a->axis != x->rank - 1)
      FAIL(at, "prune_mask: the output axis %d of %s is neither the first nor the last", a->axis, SHP(x));
    break;
  }
  case OP_MAX_TO_GRAD: {
    Shape o;
    if (!shape_eq(&in[1]->shape, s) || !shape_broadcast(s, &in[0]->shape, &o) || !shape_eq(&o, s))
      FAIL(at, "max_to_grad of %s by %s to %s: the input must have the result's shape and the gradient broadcast to it",
           SHP(&in[0]->shape), SHP(&in[1]->shape), SHP(s));
    break;
  }
  case OP_CROSS_ENTROPY_GRAD:
  case OP_EVAL_METRICS: {
    const Shape *lg = x, *lb = &in[1]->shape;
    Shape want = *lg;
    want.rank--;
    if (lg->rank < 2 || !dtype_is_float(in[0]->dtype) || in[1]->dtype != DT_I32 || !shape_eq(&want, lb))
      FAIL(at, "%s of logits %s%s and labels %s%s: expected float logits [..., C] and i32 labels [...]", name,
           dtype_name(in[0]->dtype), SHP(lg), dtype_name(in[1]->dtype), SHP(lb));
    if (op == OP_CROSS_ENTROPY_GRAD && (in[2]->shape.rank != 0 || in[2]->dtype != in[0]->dtype))
      FAIL(at, "cross_entropy_grad: the incoming gradient must be a %s scalar, got %s%s", dtype_name(in[0]->dtype),
           dtype_name(in[2]->dtype), SHP(&in[2]->shape));
    break;
  }
  case OP_FUSED:
    for (int j = 0; j < n; j++) {
      Shape o;
      /* mixed precision: loads of any float dtype widen (casts are explicit instructions) */
      bool dt_ok = in[j]->dtype == dt || (dtype_is_float(dt) && dtype_is_float(in[j]->dtype) && dt != DT_F64 &&
                                          in[j]->dtype != DT_F64);
      if (!dt_ok || !shape_broadcast(s, &in[j]->shape, &o) || !shape_eq(&o, s))
        FAIL(at, "fused input %d is %s%s: it must be %s and broadcast to %s", j, dtype_name(in[j]->dtype),
             SHP(&in[j]->shape), dtype_name(dt), SHP(s));
    }
    break;
  default:
    break;
  }
}

/* ------------------------------------------------------------ values */

static const char *const role_words[] = {"forward", "backward", "optimizer", "eval"};

/* [%ID =] OP ATTRS OPERANDS : TYPE ANNOTATIONS */
static void value_line(Parser *P, bool has_result) {
  ws(P);
  const char *id_at = P->p;
  int64_t id = -1;
  if (has_result) {
    P->p++; /* '%' */
    if (P->p >= P->eol || !isdigit((unsigned char)*P->p))
      FAIL(id_at, "expected a value id after '%%', found %s", found(P));
    id = integer(P, 0, INT32_MAX, "a value id");
    expect(P, '=', arena_printf(P->a, "'=' after %%%" PRId64, id));
    IdSlot *s = &P->slots[slot_of(P, id)];
    if (s->id >= 0) FAIL(id_at, "%%%" PRId64 " is defined twice (first on line %d)", id, s->line);
  }
  P->cur_id = id;
  ws(P);
  const char *op_at = P->p;
  const char *w = want_word(P, "an op");
  int opi = op_from_name(w);
  if (opi < 0) FAIL(op_at, "unknown op `%s`%s", w, op_hint(P, w));
  OpKind op = (OpKind)opi;
  bool side = op_info[op].flags & OPF_SIDE;
  if (has_result && side) FAIL(id_at, "%s has no result: write the line without `%%%" PRId64 " =`", w, id);
  Attr at = {0};
  bool attr_shape = false;
  Load *loads = NULL;
  int n_loads = 0;
  op_attrs(P, op, &at, &attr_shape, &loads, &n_loads);

  /* operands */
  int cap = 8, n = 0;
  Value **in = arena_alloc(P->a, (size_t)cap * sizeof *in);
  if (peek(P, '%')) {
    do {
      if (n == cap) {
        Value **ni = arena_alloc(P->a, (size_t)cap * 2 * sizeof *ni);
        memcpy(ni, in, (size_t)n * sizeof *ni);
        in = ni, cap *= 2;
      }
      in[n++] = ref(P);
    } while (accept(P, ','));
  }
  ws(P);
  if (!peek(P, ':')) {
    if (n) FAIL(P->p, "expected ',' or ':' and the type after the operands, found %s", found(P));
    FAIL(P->p, "expected the operands (%%N, ...) or ':' and the type, found %s", found(P));
  }
  P->p++;
  ws(P);
  const char *type_at = P->p;
  DType dt;
  Shape sh;
  type(P, &dt, &sh);

  /* annotations */
  Role role = ROLE_FORWARD;
  int device = -1, block = 0;
  Loc device_loc = {0};
  MemRegion region = MEM_NONE;
  int64_t offset = 0;
  bool seen_role = false;
  while (!at_eol(P)) {
    const char *an = P->p;
    if (!accept(P, '@')) FAIL(an, "expected an annotation (@backward, @device(N), @arena+N, ...) or the end of the line, found %s", found(P));
    const char *aw = word(P);
    int r = 0;
    while (aw && r < 4 && strcmp(aw, role_words[r])) r++;
    int m = 1;
    while (aw && m < MEM_COUNT && strcmp(aw, mem_region_name((MemRegion)m))) m++;
    if (aw && r < 4) {
      if (seen_role) FAIL(an, "a second role");
      seen_role = true;
      role = (Role)r;
    } else if (aw && !strcmp(aw, "block")) {
      if (block > 0) FAIL(an, "a second block");
      expect(P, '(', "'(' after @block");
      block = (int)integer(P, 1, INT32_MAX, "a block instance number");
      expect(P, ')', "')'");
    } else if (aw && !strcmp(aw, "device")) {
      if (device >= 0) FAIL(an, "a second device");
      expect(P, '(', "'(' after @device");
      device_loc = loc_at(P, an);
      device = (int)integer(P, 0, IR_MAX_STAGES - 1, "a device number");
      expect(P, ')', "')'");
    } else if (aw && m < MEM_COUNT) {
      if (region != MEM_NONE) FAIL(an, "a second memory region");
      region = (MemRegion)m;
      expect(P, '+', arena_printf(P->a, "'+' and the byte offset after @%s", aw));
      offset = integer(P, 0, INT64_MAX, "a byte offset");
    } else if (aw) {
      static const char *const names[] = {"@forward", "@backward", "@optimizer", "@eval", "@device", "@param",
                                          "@state", "@arena", "@cache", "@block"};
      FAIL(an, "unknown annotation `@%s`%s; annotations are a role (@backward, @optimizer, @eval), @block(N), "
               "@device(N) and a region (@param+N, @state+N, @arena+N, @cache+N)", aw,
           hint(P, arena_printf(P->a, "@%s", aw), names, 10));
    } else {
      FAIL(P->p, "expected a role, device or region after '@', found %s", found(P));
    }
  }

  /* arity, then the checks that need the operands */
  int ar = op_info[op].arity;
  if (ar >= 0 && n != ar) FAIL(op_at, "%s takes %d operand%s, got %d", w, ar, ar == 1 ? "" : "s", n);
  if (op == OP_CONCAT && n < 1) FAIL(op_at, "concat takes at least one operand");
  if (op == OP_FUSED) {
    if (n > FUSE_MAX_INPUTS) FAIL(op_at, "fused takes at most %d operands, got %d", FUSE_MAX_INPUTS, n);
    for (int j = 0; j < n_loads; j++) {
      int k = at.prog->ins[loads[j].line_k].a;
      if (k >= n) FAIL(loads[j].at, "in%d: the fused op has %d operand%s", k, n, n == 1 ? "" : "s");
    }
  }
  if (side != (dt == DT_VOID)) {
    if (side) FAIL(type_at, "%s has no result: its type is void", w);
    FAIL(type_at, "%s has a result: its type cannot be void", w);
  }
  /* SHAPE_ATTR and SHAPE_VIEW ops carry their result shape in the attributes */
  if (op_info[op].rule == SHAPE_ATTR || op_info[op].rule == SHAPE_VIEW || op_info[op].rule == SHAPE_CAST ||
      op == OP_CONST || op == OP_LOSS_SCALE) {
    if (!attr_shape) {
      if (op == OP_PERMUTE && at.shape.rank != sh.rank)
        FAIL(op_at, "permute lists %d axes for a result of rank %d", at.shape.rank, sh.rank);
      at.shape = sh;
    }
    at.dtype = dt;
  }
  check_value(P, op_at, op, in, n, &at, dt, &sh);
  Value *v = graph_add(P->g, op, in, n, &at, loc_at(P, op_at));
  if (v->dtype != dt || (dt != DT_VOID && !shape_eq(&v->shape, &sh))) { /* void: the shape is the operands' */
    char b1[160], b2[160];
    FAIL(type_at, "declared type %s%s differs from the inferred %s%s", dtype_name(dt), shape_str(&sh, b1, sizeof b1),
         v->dtype == DT_VOID ? "void" : dtype_name(v->dtype), v->dtype == DT_VOID ? "" : shape_str(&v->shape, b2, sizeof b2));
  }
  v->role = role;
  v->device = device;
  v->device_loc = device_loc;
  v->block = block;
  v->region = region;
  v->offset = region == MEM_NONE ? 0 : offset;
  if (has_result) {
    IdSlot *s = &P->slots[slot_of(P, id)];
    *s = (IdSlot){id, v, P->line};
  }
}

/* ------------------------------------------------------------- train */

static const char *const train_key_names[] = {"data", "optimizer", "batch", "epochs", "steps", "seed",
                                              "log_every", "eval", "eval_every", "eval_batches", "precision",
                                              "micro_batches", "recompute", "lr_schedule", "clip_grad_norm",
                                              "offload"};
enum { N_TRAIN_KEYS = sizeof train_key_names / sizeof *train_key_names };

/* adamw(lr = X, ...) or sgd(...) */
static void optimizer(Parser *P, TrainSpec *t) {
  ws(P);
  const char *at = P->p;
  const char *w = want_word(P, "adamw(...) or sgd(...)");
  bool sgd = !strcmp(w, "sgd");
  if (!sgd && strcmp(w, "adamw")) FAIL(at, "unknown optimizer `%s`; expected adamw or sgd", w);
  t->optimizer = sgd ? OPTIM_SGD : OPTIM_ADAMW;
  if (sgd) t->weight_decay = 0;
  expect(P, '(', "'(' and the optimizer's arguments");
  static const char *const keys[] = {"lr", "weight_decay", "beta1", "beta2", "eps", "momentum", "decay", "state"};
  unsigned seen = 0;
  if (!accept(P, ')')) {
    do {
      ws(P);
      const char *ka = P->p;
      const char *k = want_word(P, "an optimizer argument");
      int i = 0;
      while (i < 8 && strcmp(keys[i], k)) i++;
      if (i == 8 || (sgd && ((i >= 2 && i <= 4) || i == 7)) || (!sgd && i == 5))
        FAIL(ka, "%s has no argument `%s` (%s)", w, k,
             sgd ? "lr, momentum, weight_decay, decay" : "lr, weight_decay, beta1, beta2, eps, decay, state");
      if (seen & (1u << i)) FAIL(ka, "%s argument `%s` is given twice", w, k);
      seen |= 1u << i;
      expect(P, '=', arena_printf(P->a, "'=' after `%s`", k));
      ws(P);
      const char *va = P->p;
      if (i == 6) {
        const char *s = string(P, "\"all\" or \"matrices\"");
        if (strcmp(s, "all") && strcmp(s, "matrices")) FAIL(va, "decay must be \"all\" or \"matrices\"");
        t->decay_matrices_only = !strcmp(s, "matrices");
        continue;
      }
      if (i == 7) {
        const char *s = want_word(P, "int8 or f32");
        if (strcmp(s, "int8") && strcmp(s, "f32")) FAIL(va, "adamw state must be int8 or f32");
        t->state_int8 = !strcmp(s, "int8");
        continue;
      }
      double x = number(P, arena_printf(P->a, "the value of `%s`", k));
      bool below1 = i == 2 || i == 3 || i == 5;
      if (!isfinite(x) || x < 0 || (i == 0 && x == 0) || (below1 && x >= 1))
        FAIL(va, "%s must be %s, got %s", k, i == 0 ? "positive" : below1 ? "in [0, 1)" : "a non-negative number",
             ir_num_str(x, (char[32]){0}, 32));
      double *dst[] = {&t->lr, &t->weight_decay, &t->beta1, &t->beta2, &t->eps, &t->momentum};
      *dst[i] = x;
      if (i == 0) t->has_lr = true;
      if (i == 1) t->has_weight_decay = true;
    } while (accept(P, ','));
    expect(P, ')', "',' or ')' in the optimizer's arguments");
  }
}

/* constant, constant(warmup = N), cosine(warmup = N, min_lr = X),
 * linear(...): the printer's form (ir.c print_train). */
static void lr_schedule(Parser *P, TrainSpec *t) {
  ws(P);
  const char *at = P->p;
  const char *w = want_word(P, "constant, cosine(...) or linear(...)");
  static const char *const names[] = {"constant", "cosine", "linear"};
  int kind = 0;
  while (kind < 3 && strcmp(names[kind], w)) kind++;
  if (kind == 3) FAIL(at, "unknown lr_schedule `%s`; expected constant, cosine or linear", w);
  t->lr_schedule = (LrSchedule)kind;
  if (!accept(P, '(')) return;
  unsigned seen = 0;
  if (!accept(P, ')')) {
    do {
      ws(P);
      const char *ka = P->p;
      const char *k = want_word(P, "warmup or min_lr");
      int i = !strcmp(k, "warmup") ? 0 : !strcmp(k, "min_lr") ? 1 : 2;
      if (i == 2 || (i == 1 && kind == LR_CONSTANT))
        FAIL(ka, "%s has no argument `%s` (%s)", w, k, kind == LR_CONSTANT ? "warmup" : "warmup, min_lr");
      if (seen & (1u << i)) FAIL(ka, "%s argument `%s` is given twice", w, k);
      seen |= 1u << i;
      expect(P, '=', arena_printf(P->a, "'=' after `%s`", k));
      ws(P);
      const char *va = P->p;
      if (i == 0) {
        t->warmup = integer(P, 0, INT64_MAX, "warmup");
      } else {
        double x = number(P, "the value of `min_lr`");
        if (!(x >= 0) || !isfinite(x))
          FAIL(va, "min_lr must be a non-negative number, got %s", ir_num_str(x, (char[32]){0}, 32));
        t->min_lr = x;
      }
    } while (accept(P, ','));
    expect(P, ')', "',' or ')' in the schedule's arguments");
  }
}

/* One `KEY = VALUE` line inside `train { }`, or its closing `}`. */
static void train_line(Parser *P) {
  TrainSpec *t = &P->g->train;
  if (accept(P, '}')) {
    want_eol(P, "'}'");
    P->in_train = false;
    return;
  }
  ws(P);
  const char *ka = P->p;
  const char *k = word(P);
  if (!k) FAIL(ka, "expected a train key or the '}' closing the train section of line %d, found %s", P->train_line, found(P));
  int i = 0;
  while (i < N_TRAIN_KEYS && strcmp(train_key_names[i], k)) i++;
  if (i == N_TRAIN_KEYS)
    FAIL(ka, "unknown train key `%s`%s (keys: data, optimizer, batch, epochs, steps, seed, log_every, eval, "
             "eval_every, eval_batches, precision, micro_batches, recompute, lr_schedule, clip_grad_norm, offload)", k,
             hint(P, k, train_key_names, N_TRAIN_KEYS));
  if (P->train_keys & (1u << i)) FAIL(ka, "train key `%s` is set twice", k);
  P->train_keys |= 1u << i;
  expect(P, '=', arena_printf(P->a, "'=' after `%s`", k));
  ws(P);
  const char *va = P->p;
  switch (i) {
  case 0: { /* data */
    const char *src = want_word(P, "fashion_mnist(\"DIR\"), text(\"FILE\", block = T) or npy(\"X\", \"Y\")");
    bool tokens = !strcmp(src, "tokens"), text = tokens || !strcmp(src, "text");
    if (!strcmp(src, "npy")) { /* npy("X", "Y"[, val_fraction = F][, val_x = "VX", val_y = "VY"]) */
      expect(P, '(', "'(' and the x path");
      t->data = DATA_NPY;
      t->data_path = string(P, "the x path");
      expect(P, ',', "',' and the y path");
      t->data_y = string(P, "the y path");
      while (accept(P, ',')) {
        ws(P);
        const char *ka2 = P->p;
        const char *w = want_word(P, "val_fraction, val_x or val_y");
        expect(P, '=', "'='");
        if (!strcmp(w, "val_fraction")) {
          t->val_fraction = number(P, "val_fraction");
          if (!(t->val_fraction > 0 && t->val_fraction < 1))
            FAIL(ka2, "val_fraction must be between 0 and 1 (exclusive)");
        } else if (!strcmp(w, "val_x")) t->val_x = string(P, "the val_x path");
        else if (!strcmp(w, "val_y")) t->val_y = string(P, "the val_y path");
        else FAIL(ka2, "npy has no argument `%s` (val_fraction, val_x, val_y)", w);
      }
      if (!t->val_x != !t->val_y || (t->val_x && t->val_fraction > 0))
        FAIL(va, "npy takes val_fraction, or val_x and val_y together");
      expect(P, ')', "')'");
      break;
    }
    if (!text && strcmp(src, "fashion_mnist"))
      FAIL(va, "unknown data source `%s`; expected fashion_mnist(\"DIR\"), text(\"FILE\", block = T) or npy(\"X\", \"Y\")", src);
    expect(P, '(', "'(' and the path");
    t->data = tokens ? DATA_TOKENS : text ? DATA_TEXT : DATA_FASHION_MNIST;
    t->data_path = string(P, "the path");
    if (text) {
      expect(P, ',', "',' and block = T");
      ws(P);
      const char *ba = P->p;
      const char *b = want_word(P, "block = T");
      if (strcmp(b, "block")) FAIL(ba, "expected block = T, found `%s`", b);
      expect(P, '=', "'=' after `block`");
      t->block = integer(P, 1, INT32_MAX, "block");
    } else if (accept(P, ',')) { /* fashion_mnist("DIR", val_fraction = F) */
      ws(P);
      const char *fa = P->p;
      const char *w = want_word(P, "val_fraction = F");
      if (strcmp(w, "val_fraction")) FAIL(fa, "fashion_mnist has no argument `%s` (val_fraction)", w);
      expect(P, '=', "'=' after `val_fraction`");
      t->val_fraction = number(P, "val_fraction");
      if (!(t->val_fraction > 0 && t->val_fraction < 1)) FAIL(fa, "val_fraction must be between 0 and 1 (exclusive)");
    }
    expect(P, ')', "')'");
    break;
  }
  case 1: optimizer(P, t); break;
  case 2: t->batch = integer(P, 1, INT32_MAX, "batch"); break;
  case 3: t->epochs = integer(P, 1, INT64_MAX, "epochs"); break;
  case 4: t->steps = integer(P, 0, INT64_MAX, "steps"); break;
  case 5: t->seed = (uint64_t)integer(P, 0, INT64_MAX, "seed"); break;
  case 6: t->log_every = integer(P, 1, INT64_MAX, "log_every"); break;
  case 7: {
    const char *b = want_word(P, "true or false");
    if (strcmp(b, "true") && strcmp(b, "false")) FAIL(va, "eval must be true or false");
    t->eval = !strcmp(b, "true");
    break;
  }
  case 8: t->eval_every = integer(P, 0, INT64_MAX, "eval_every"); break;
  case 9: t->eval_batches = integer(P, 1, INT32_MAX, "eval_batches"); break;
  case 10: {
    const char *s = string(P, "\"auto\", \"fp32\", \"fp16\" or \"bf16\"");
    if (strcmp(s, "auto") && strcmp(s, "fp32") && strcmp(s, "fp16") && strcmp(s, "bf16"))
      FAIL(va, "precision must be \"auto\", \"fp32\", \"fp16\" or \"bf16\"");
    t->precision = s;
    break;
  }
  case 11: t->micro_batches = integer(P, 1, INT32_MAX, "micro_batches"); break;
  case 12: {
    const char *s = string(P, "\"none\", \"blocks\" or \"auto\"");
    if (strcmp(s, "none") && strcmp(s, "blocks") && strcmp(s, "auto"))
      FAIL(va, "recompute must be \"none\", \"blocks\" or \"auto\"");
    t->recompute = s;
    break;
  }
  case 13: lr_schedule(P, t); break;
  case 14: {
    double x = number(P, "the value of `clip_grad_norm`");
    if (!(x > 0) || !isfinite(x))
      FAIL(va, "clip_grad_norm must be a number > 0, got %s", ir_num_str(x, (char[32]){0}, 32));
    t->clip_grad_norm = x;
    break;
  }
  case 15: {
    const char *s = string(P, "\"none\" or \"optimizer\"");
    if (strcmp(s, "none") && strcmp(s, "optimizer")) FAIL(va, "offload must be \"none\" or \"optimizer\"");
    t->offload = s;
    break;
  }
  }
  want_eol(P, arena_printf(P->a, "the value of `%s`", k));
}

/* ----------------------------------------------------------- headers */

/* The fields of a `prune` header line (the mode first), each checked as
 * the .model's prune section checks it; the whole spec is checked once the
 * graph is known (check_prune). */
static void prune_header(Parser *P) {
  static const char *const keys[] = {"mode", "sparsity", "initial", "start", "end", "every", "params"};
  static const unsigned bits[] = {PRUNE_SET_MODE, PRUNE_SET_SPARSITY, PRUNE_SET_INITIAL, PRUNE_SET_START,
                                  PRUNE_SET_END, PRUNE_SET_EVERY, PRUNE_SET_PARAMS};
  PruneSpec *ps = &P->g->prune;
  while (!at_eol(P)) {
    ws(P);
    const char *ka = P->p;
    const char *k = want_word(P, "a prune key (mode, sparsity, initial, start, end, every, params)");
    int i = 0;
    while (i < 7 && strcmp(keys[i], k)) i++;
    if (i == 7) FAIL(ka, "unknown prune key `%s`%s (mode, sparsity, initial, start, end, every, params)", k, hint(P, k, keys, 7));
    if (ps->set & bits[i]) FAIL(ka, "prune key `%s` is given twice", k);
    ps->set |= bits[i];
    expect(P, '=', arena_printf(P->a, "'=' after `%s`", k));
    const char *va = skip_ws(P, P->p);
    if (i == 0) {
      const char *m = string(P, "the mode, a string");
      if (prune_mode_parse(m, &ps->mode, &ps->nm_n, &ps->nm_m))
        FAIL(va, "unknown prune mode `%s` (unstructured, global, channels, or N:M such as 2:4)", m);
    } else if (i == 1 || i == 2) {
      double x = number(P, arena_printf(P->a, "the %s", k));
      if (!(x >= 0 && x < 1)) FAIL(va, "prune %s must be in [0, 1), got %s", k, ir_num_str(x, (char[32]){0}, 32));
      *(i == 1 ? &ps->sparsity : &ps->initial) = x;
    } else if (i < 6) {
      int64_t x = integer(P, i == 5 ? 1 : 0, INT64_MAX / 4, arena_printf(P->a, "the %s step", k));
      *(i == 3 ? &ps->start : i == 4 ? &ps->end : &ps->every) = x;
    } else {
      ps->params = string(P, "the params patterns");
    }
  }
  if (!(ps->set & PRUNE_SET_MODE)) FAIL(P->bol, "the prune line needs mode=\"...\" (unstructured, global, channels, 2:4)");
}

/* A `shrink param="P" axis=A full=N group=G source="W" kind=own|bias|next
 * [out=A acts="..." fold=0|1 bias="B"]` line (the shrink pass's table,
 * Graph.shrink; the keys in any order, the first five required). */
static void shrink_header(Parser *P) {
  Graph *g = P->g;
  ShrinkAxis x = {.next_out = -1};
  static const char *const keys[] = {"param", "axis", "full", "group", "source", "kind", "out", "acts", "fold", "bias"};
  unsigned seen = 0;
  while (!at_eol(P)) {
    ws(P);
    const char *ka = P->p;
    const char *k = want_word(P, "a shrink key (param, axis, full, group, source, kind, out, acts, fold, bias)");
    int i = 0;
    while (i < 10 && strcmp(keys[i], k)) i++;
    if (i == 10) FAIL(ka, "unknown shrink key `%s`%s", k, hint(P, k, keys, 10));
    if (seen & (1u << i)) FAIL(ka, "shrink key `%s` is given twice", k);
    seen |= 1u << i;
    expect(P, '=', arena_printf(P->a, "'=' after `%s`", k));
    const char *va = skip_ws(P, P->p);
    if (i == 0) x.param = string(P, "a param name, a string");
    else if (i == 4) x.source = string(P, "a param name, a string");
    else if (i == 9) x.next_bias = string(P, "a param name, a string");
    else if (i == 7) x.acts = string(P, "the activations, a string");
    else if (i == 1 || i == 6) *(i == 1 ? &x.axis : &x.next_out) = (int)integer(P, 0, IR_MAX_RANK - 1, "an axis");
    else if (i == 8) x.fold = integer(P, 0, 1, "fold (0 or 1)") != 0;
    else if (i == 2 || i == 3) *(i == 2 ? &x.full : &x.group) = integer(P, 1, INT64_MAX / 4, arena_printf(P->a, "the %s", k));
    else {
      const char *kd = want_word(P, "own, bias or next");
      x.kind = !strcmp(kd, "own") ? SHRINK_OWN : !strcmp(kd, "bias") ? SHRINK_BIAS : !strcmp(kd, "next") ? SHRINK_NEXT : -1;
      if (x.kind < 0) FAIL(va, "unknown shrink kind `%s` (own, bias, next)", kd);
    }
  }
  if ((seen & 0x3f) != 0x3f) FAIL(P->bol, "the shrink line needs param, axis, full, group, source and kind");
  if (x.kind == SHRINK_NEXT && !(seen & (1u << 6))) FAIL(P->bol, "a shrink line of kind next needs out=A");
  ShrinkAxis *t = arena_alloc(P->a, ((size_t)g->n_shrink + 1) * sizeof *t);
  if (g->n_shrink) memcpy(t, g->shrink, (size_t)g->n_shrink * sizeof *t);
  int *lines = arena_alloc(P->a, ((size_t)g->n_shrink + 1) * sizeof *lines);
  if (g->n_shrink) memcpy(lines, P->shrink_lines, (size_t)g->n_shrink * sizeof *lines);
  lines[g->n_shrink] = P->line;
  P->shrink_lines = lines;
  t[g->n_shrink++] = x;
  g->shrink = t;
}

/* Every name of the shrink lines is a param of the graph (lowering looks
 * them up); the first line naming another is an error. */
static void check_shrink(Parser *P) {
  Graph *g = P->g;
  for (int k = 0; k < g->n_shrink; k++) {
    const char *names[3] = {g->shrink[k].param, g->shrink[k].source, g->shrink[k].next_bias};
    for (int j = 0; j < 3; j++) {
      bool found = !names[j];
      for (int i = 0; i < g->n_values && !found; i++)
        found = g->values[i]->op == OP_PARAM && g->values[i]->attr.name && !strcmp(g->values[i]->attr.name, names[j]);
      if (!found) fail_loc(P, (Loc){P->src, P->shrink_lines[k], 1}, "shrink: `%s` is no param of the graph", names[j]);
    }
  }
}

/* A graph the prune pass went through (prune_mask values) carries its
 * complete spec, which lowering reads. */
static void check_prune(Parser *P) {
  Graph *g = P->g;
  const Value *mask = NULL;
  for (int i = 0; i < g->n_values && !mask; i++)
    if (g->values[i]->op == OP_PRUNE_MASK) mask = g->values[i];
  if (!mask) return;
  Loc at = {P->src, P->prune_line, 1};
  if (!P->prune_line) fail_loc(P, mask->loc, "prune_mask values need the `prune` line (the spec they were made for)");
  PruneSpec c = g->prune;
  char err[300];
  unsigned all = PRUNE_SET_SPARSITY | PRUNE_SET_MODE | PRUNE_SET_START | PRUNE_SET_END | PRUNE_SET_EVERY |
                 PRUNE_SET_INITIAL;
  if ((c.set & all) != all)
    fail_loc(P, at, "a graph with prune_mask values needs every key but params on its prune line (mode, sparsity, "
                    "initial, start, end, every: as the prune pass prints it)");
  if (prune_spec_resolve(&c, err, sizeof err)) fail_loc(P, at, "%s", err);
  for (int i = 0; i < g->n_values && c.mode == PRUNE_NM; i++) { /* groups of M inputs per output channel */
    const Value *v = g->values[i];
    if (v->op != OP_PRUNE_MASK) continue;
    const Shape *s = &v->in[0]->shape;
    int64_t out = v->attr.axis >= 0 ? s->dim[v->attr.axis] : 0;
    if (!out || (shape_numel(s) / out) % c.nm_m)
      fail_loc(P, v->loc, "%d:%d pruning of %%%d %s: %s", c.nm_n, c.nm_m, v->in[0]->id, SHP(s),
               out ? "its input count does not divide into groups" : "prune_mask has no output axis ([out=A])");
  }
}

static void once(Parser *P, const char *at, int *line, const char *what) {
  if (*line) FAIL(at, "a second `%s` line (the first is line %d)", what, *line);
  *line = P->line;
}

static void parse_line(Parser *P) {
  if (P->in_train) {
    if (at_eol(P)) return;
    train_line(P);
    return;
  }
  if (at_eol(P)) return; /* blank or comment */
  const char *at = P->p;
  if (!P->model_line) {
    const char *w = word(P);
    if (!w || strcmp(w, "model")) {
      P->p = at;
      FAIL(at, "an IR file starts with `model NAME`, found %s", found(P));
    }
    P->model_line = P->line;
    P->g->model_name = want_word(P, "the model name");
    want_eol(P, "the model name");
    return;
  }
  if (*at == '%') {
    value_line(P, true);
    return;
  }
  const char *w = word(P);
  if (!w) FAIL(at, "expected a value (`%%N = op ...`), an op or a keyword, found %s", found(P));
  Graph *g = P->g;
  if (!strcmp(w, "model")) {
    FAIL(at, "a second `model` line (the first is line %d)", P->model_line);
  } else if (!strcmp(w, "after")) {
    once(P, at, &P->after_line, "after");
    g->after_pass = want_word(P, "a pass name");
    want_eol(P, "the pass name");
  } else if (!strcmp(w, "float_dtype")) {
    once(P, at, &P->float_line, "float_dtype");
    ws(P);
    const char *da = P->p;
    const char *d = want_word(P, "f32 or f64");
    int t = dtype_from_name(d);
    if (t != DT_F32 && t != DT_F64) FAIL(da, "float_dtype must be f32 or f64, got `%s`", d);
    g->float_dtype = (DType)t;
    want_eol(P, "the dtype");
  } else if (!strcmp(w, "decode")) {
    once(P, at, &P->decode_line, "decode");
    ws(P);
    const char *ca = P->p;
    const char *c = want_word(P, "context=N");
    if (strcmp(c, "context")) FAIL(ca, "expected context=N, found `%s`", c);
    expect(P, '=', "'=' after `context`");
    g->decode = true;
    g->context = integer(P, 1, INT32_MAX, "the context");
    want_eol(P, "the context");
  } else if (!strcmp(w, "train")) {
    once(P, at, &P->train_line, "train");
    expect(P, '{', "'{' after `train`");
    want_eol(P, "'{' (the train keys follow one a line, then '}')");
    P->in_train = true;
  } else if (!strcmp(w, "prune")) {
    once(P, at, &P->prune_line, "prune");
    prune_header(P);
  } else if (!strcmp(w, "stages")) {
    once(P, at, &P->stages_line, "stages");
    g->n_stages = (int)integer(P, 2, IR_MAX_STAGES, "the number of stages");
    want_eol(P, "the number of stages");
  } else if (!strcmp(w, "replicas")) {
    once(P, at, &P->replicas_line, "replicas");
    g->replicas = (int)integer(P, 2, IR_MAX_REPLICAS, "the number of replicas");
    want_eol(P, "the number of replicas");
  } else if (!strcmp(w, "bucket_mb")) {
    once(P, at, &P->bucket_line, "bucket_mb");
    g->bucket_mb = number(P, "the MiB of an all-reduce bucket (--bucket-mb)");
    if (!(g->bucket_mb > 0 && g->bucket_mb <= 1e9))
      FAIL(at, "bucket_mb must be a number of MiB > 0 (and at most 1e9), got %s", ir_num_str(g->bucket_mb, (char[32]){0}, 32));
    want_eol(P, "the MiB of an all-reduce bucket");
  } else if (!strcmp(w, "shrink")) { /* the shrink pass's table (passes/shrink.c) */
    shrink_header(P);
  } else if (!strcmp(w, "qat")) { /* the quantize section (passes/quantize.c, pass_qat) */
    once(P, at, &P->qat_line, "qat");
    g->qat = (int)integer(P, 1, 2, "the int8 granularity of quantization-aware training (1 per channel, 2 per tensor)");
    want_eol(P, "the int8 granularity");
  } else if (!strcmp(w, "zero")) {
    once(P, at, &P->zero_line, "zero");
    g->zero = (int)integer(P, 1, 1, "the ZeRO stage (1)");
    want_eol(P, "the ZeRO stage");
  } else if (!strcmp(w, "regions")) {
    int64_t *bytes = g->region_bytes;
    ws(P);
    if (!strncmp(P->p, "device", 6) && (P->p[6] == ' ' || P->p[6] == '\t')) {
      want_word(P, "device");
      const char *da = P->p;
      int dev = (int)integer(P, 0, IR_MAX_STAGES - 1, "a device number");
      if (dev >= g->n_stages) FAIL(da, "device %d: the `stages` line (before) says %d stages", dev, g->n_stages);
      if (P->device_regions[dev / 64] & (1ull << (dev % 64))) FAIL(da, "regions of device %d are given twice", dev);
      P->device_regions[dev / 64] |= 1ull << (dev % 64);
      bytes = g->stage_bytes[dev];
    } else {
      once(P, at, &P->regions_line, "regions");
    }
    unsigned seen = 0;
    while (!at_eol(P)) {
      const char *ra = P->p;
      const char *r = want_word(P, "a region (param, state, arena, cache)");
      int m = 1;
      while (m < MEM_COUNT && strcmp(r, mem_region_name((MemRegion)m))) m++;
      if (m == MEM_COUNT) FAIL(ra, "unknown region `%s` (param, state, arena, cache)", r);
      if (seen & (1u << m)) FAIL(ra, "region `%s` is given twice", r);
      seen |= 1u << m;
      expect(P, '=', arena_printf(P->a, "'=' after `%s`", r));
      bytes[m] = integer(P, 0, INT64_MAX / 2, "a size in bytes");
    }
    if (bytes != g->region_bytes && bytes == g->stage_bytes[0])
      memcpy(g->region_bytes, bytes, sizeof g->region_bytes);
    P->have_regions = true;
  } else if (!strcmp(w, "loss") || !strcmp(w, "logits") || !strcmp(w, "labels")) {
    int *ln = !strcmp(w, "loss") ? &P->loss_line : !strcmp(w, "logits") ? &P->logits_line : &P->labels_line;
    once(P, at, ln, w);
    ws(P);
    const char *va = P->p;
    Value *v = ref(P);
    want_eol(P, "the value");
    if (ln == &P->loss_line) {
      if (v->shape.rank != 0 || !dtype_is_float(v->dtype))
        FAIL(va, "the loss must be a float scalar, %%%d is %s%s", v->id, dtype_name(v->dtype), SHP(&v->shape));
      g->loss = v;
    } else if (ln == &P->logits_line) {
      if (v->shape.rank < 2 || !dtype_is_float(v->dtype))
        FAIL(va, "logits must be float [..., C], %%%d is %s%s", v->id, dtype_name(v->dtype), SHP(&v->shape));
      g->logits = v;
    } else {
      if (v->dtype != DT_I32) FAIL(va, "labels must be i32, %%%d is %s", v->id, dtype_name(v->dtype));
      g->labels = v;
    }
  } else if (!strcmp(w, "grad")) {
    ws(P);
    const char *pa = P->p;
    Value *p = ref(P);
    ws(P);
    const char *ga = P->p;
    Value *d = ref(P);
    want_eol(P, "the gradient");
    if (p->op != OP_PARAM) FAIL(pa, "grad: %%%d is %s, not a param", p->id, op_info[p->op].name);
    if (p->grad) FAIL(pa, "grad: %%%d already has a gradient (%%%d)", p->id, p->grad->id);
    if (d->dtype != p->dtype || !shape_eq(&d->shape, &p->shape))
      FAIL(ga, "grad: %%%d is %s%s, the param %%%d is %s%s", d->id, dtype_name(d->dtype), SHP(&d->shape), p->id,
           dtype_name(p->dtype), SHP(&p->shape));
    p->grad = d;
  } else {
    int op = op_from_name(w);
    if (op < 0) {
      static const char *const kw[] = {"model", "after", "float_dtype", "decode", "train", "regions", "loss", "logits",
                                       "labels", "grad", "stages", "replicas", "prune", "zero", "bucket_mb", "qat",
                                       "shrink"};
      const char *h = hint(P, w, kw, 17);
      FAIL(at, "unknown op `%s`%s", w, *h ? h : op_hint(P, w));
    }
    if (!(op_info[op].flags & OPF_SIDE)) FAIL(at, "%s has a result: the line must start with `%%N =`", w);
    P->p = at;
    value_line(P, false);
  }
}

/* ------------------------------------------------------ whole graph */

/* Memory regions: all values with a result have one, or none has; each lies
 * inside its region, aligned to its element size; params and state where
 * the runtime expects them; no two values live at the same time share a
 * byte (ir_check_memory). */
static void check_regions(Parser *P) {
  Graph *g = P->g;
  int with = 0, without = 0;
  Value *first_without = NULL;
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if (v->dtype == DT_VOID) {
      if (v->region != MEM_NONE) fail_loc(P, v->loc, "%s has no result and so no memory region", op_info[v->op].name);
      continue;
    }
    if (v->region == MEM_NONE) {
      without++;
      if (!first_without) first_without = v;
      continue;
    }
    with++;
    MemRegion want = v->op == OP_PARAM    ? MEM_PARAM
                   : v->op == OP_STATE    ? (v->attr.kv_cache ? MEM_CACHE : MEM_STATE)
                   : ir_param_transfer(v) && g->train.micro_batches > 1 ? MEM_CACHE
                                          : MEM_ARENA;
    if (v->region != want)
      fail_loc(P, v->loc, "%%%d (%s) must live in @%s, not @%s", v->id, op_info[v->op].name, mem_region_name(want),
               mem_region_name(v->region));
    int64_t bytes = (int64_t)dtype_size(v->dtype) * shape_numel(&v->shape);
    const int64_t *rb = g->n_stages > 1 && v->device >= 0 && v->device < g->n_stages ? g->stage_bytes[v->device]
                                                                                      : g->region_bytes;
    if (v->offset % (int64_t)dtype_size(v->dtype) || v->offset > rb[v->region] - bytes)
      fail_loc(P, v->loc, "%%%d: %" PRId64 " bytes at @%s+%" PRId64 " do not fit the region (%" PRId64 " bytes%s%s)", v->id,
               bytes, mem_region_name(v->region), v->offset, rb[v->region],
               P->have_regions ? "" : "; the `regions` line is missing",
               v->offset % (int64_t)dtype_size(v->dtype) ? ", or the offset is misaligned" : "");
  }
  if (with && without)
    fail_loc(P, first_without->loc, "%%%d has no memory region while others have one (a planned graph places every value)",
             first_without->id);
  /* a hand-edited plan that puts a value on the bytes of one still in use */
  MemConflict mc;
  if (with && ir_check_memory(g, &mc)) {
    char buf[512];
    fail_loc(P, mc.b->loc, "%s", ir_memconflict_str(g, &mc, buf, sizeof buf));
  }
}

/* A partitioned graph (`stages N`): every value on a device 0..N-1, every
 * operand on its op's device except a transfer's, which is on another. */
static void check_devices(Parser *P) {
  Graph *g = P->g;
  if (g->n_stages <= 1) {
    for (int i = 0; i < g->n_values; i++)
      if (g->values[i]->op == OP_TRANSFER)
        fail_loc(P, g->values[i]->loc, "a transfer in a graph of one device (the `stages N` line is missing)");
    return;
  }
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if (v->device < 0 || v->device >= g->n_stages)
      fail_loc(P, v->loc, "%%%d must be on a device 0..%d (@device(N)): the graph has %d stages", v->id,
               g->n_stages - 1, g->n_stages);
  }
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    for (int j = 0; j < v->n_in; j++) {
      Value *x = v->in[j];
      if (v->op == OP_TRANSFER && x->device == v->device)
        fail_loc(P, v->loc, "transfer %%%d copies %%%d onto the device it is on (%d)", v->id, x->id, v->device);
      if (v->op != OP_TRANSFER && x->device != v->device)
        fail_loc(P, v->loc, "%%%d on device %d reads %%%d on device %d: operands on another device need a transfer",
                 v->id, v->device, x->id, x->device);
    }
  }
}

/* The inputs the data source feeds (as the frontend checks them). */
static void check_inputs(Parser *P) {
  Graph *g = P->g;
  const TrainSpec *t = &g->train;
  if (g->decode || (t->data != DATA_TEXT && t->data != DATA_TOKENS && t->data != DATA_FASHION_MNIST)) return;
  Value *in[2] = {NULL, NULL};
  int n = 0;
  for (int i = 0; i < g->n_values; i++)
    if (g->values[i]->op == OP_INPUT) {
      if (n < 2) in[n] = g->values[i];
      n++;
    }
  Loc where = n ? in[0]->loc : (Loc){P->src, P->train_line, 1};
  if (t->data == DATA_TEXT || t->data == DATA_TOKENS) {
    if (n != 2) fail_loc(P, where, "text feeds two inputs (tokens and next tokens, i32[batch,block]); the graph has %d", n);
    for (int i = 0; i < 2; i++) {
      Value *x = in[i];
      if (x->dtype != DT_I32 || x->shape.rank != 2 || x->shape.dim[0] != t->batch || x->shape.dim[1] != t->block)
        fail_loc(P, x->loc, "text windows are i32[%" PRId64 ",%" PRId64 "] (batch, block); `%s` is %s%s", t->batch, t->block,
                 x->attr.name, dtype_name(x->dtype), SHP(&x->shape));
    }
    return;
  }
  if (n != 2)
    fail_loc(P, where, "fashion_mnist feeds two inputs (images f32[batch,784] and labels i32[batch]); the graph has %d", n);
  Value *x = in[0], *y = in[1];
  if (!dtype_is_float(x->dtype) || x->shape.rank < 2 || x->shape.dim[0] != t->batch ||
      shape_numel(&x->shape) / x->shape.dim[0] != 784)
    fail_loc(P, x->loc, "fashion_mnist images are f32[%" PRId64 ",784] (batch, 28*28 pixels); `%s` is %s%s", t->batch,
             x->attr.name, dtype_name(x->dtype), SHP(&x->shape));
  if (y->dtype != DT_I32 || y->shape.rank != 1 || y->shape.dim[0] != t->batch)
    fail_loc(P, y->loc, "fashion_mnist labels are i32[%" PRId64 "]; `%s` is %s%s", t->batch, y->attr.name,
             dtype_name(y->dtype), SHP(&y->shape));
}

/* Params, state and inputs are named tensors (checkpoint keys): unique. */
static void check_names(Parser *P) {
  Graph *g = P->g;
  NameMap seen = {0};
  for (int i = 0; i < g->n_values; i++) {
    Value *v = g->values[i];
    if (v->op != OP_PARAM && v->op != OP_STATE && v->op != OP_INPUT) continue;
    void **slot = namemap_slot(P->a, &seen, v->attr.name);
    if (*slot) fail_loc(P, v->loc, "tensor name \"%s\" is already used by %%%d", v->attr.name, ((Value *)*slot)->id);
    *slot = v;
  }
}

/* The loss is required (as in a .model); logits and labels come together,
 * shaped as the eval pass's eval_metrics needs them. */
static void check_trailer(Parser *P) {
  Graph *g = P->g;
  Loc end = {P->src, P->line, 1};
  if (!g->loss) fail_loc(P, end, "no `loss %%N` line: the graph has no loss to train");
  if (!g->logits != !g->labels)
    fail_loc(P, (Loc){P->src, g->logits ? P->logits_line : P->labels_line, 1},
             "`logits` and `labels` come together (the eval pass measures the logits against the labels)");
  if (g->logits) {
    Shape want = g->logits->shape;
    want.rank--;
    if (!shape_eq(&want, &g->labels->shape))
      fail_loc(P, (Loc){P->src, P->labels_line, 1}, "labels %s do not fit logits %s (expected labels %s)",
               SHP(&g->labels->shape), SHP(&g->logits->shape), SHP(&want));
  }
}

/* Every line, then the checks of the whole graph. */
static void parse_all(Parser *P) {
  const Source *src = P->src;
  const char *text = src->text, *end = src->text + src->len;
  size_t lines = 1;
  for (const char *q = text; q < end; q++) lines += *q == '\n' || *q == '\r';
  P->cap = 16;
  while (P->cap < 2 * lines) P->cap *= 2;
  P->slots = arena_alloc(P->a, P->cap * sizeof *P->slots);
  for (size_t i = 0; i < P->cap; i++) P->slots[i].id = -1;
  for (const char *q = text;;) {
    const char *e = q;
    while (e < end && *e != '\n' && *e != '\r') e++;
    P->line++;
    P->bol = P->p = q;
    P->eol = e;
    P->cur_id = -1;
    parse_line(P);
    if (e >= end) break;
    q = e + ((*e == '\r' && e + 1 < end && e[1] == '\n') ? 2 : 1);
  }
  if (P->in_train) fail_loc(P, (Loc){src, P->train_line, 1}, "the train section is not closed with `}`");
  if (!P->model_line) fail_loc(P, (Loc){src, 0, 0}, "no `model NAME` line: not an IR file");
  if (P->g->n_values == 0) fail_loc(P, (Loc){src, P->model_line, 1}, "the graph has no values");
  check_trailer(P);
  if (P->g->replicas > 1 && P->g->train.micro_batches % P->g->replicas)
    fail_loc(P, (Loc){src, P->replicas_line, 1}, "%d replicas do not share %" PRId64 " micro-batches equally (the train "
             "section's micro_batches counts every replica's)", P->g->replicas, P->g->train.micro_batches);
  if (P->g->bucket_mb > 0 && P->g->replicas < 2)
    fail_loc(P, (Loc){src, P->bucket_line, 1}, "`bucket_mb` sizes the all-reduce buckets of the replicas: it needs a "
             "`replicas N` line (N >= 2)");
  if (P->g->zero && P->g->replicas < 2)
    fail_loc(P, (Loc){src, P->zero_line, 1}, "`zero 1` shards the optimizer state over the replicas: it needs a "
             "`replicas N` line (N >= 2)");
  check_devices(P);
  const Value *ab;
  char abuf[256];
  if (ir_check_allreduce(P->g, &ab, abuf, sizeof abuf)) fail_loc(P, ab->loc, "%s", abuf);
  check_regions(P);
  check_inputs(P);
  check_names(P);
  check_prune(P);
  check_shrink(P);
  graph_count_uses(P->g);
}

Graph *ir_parse(Arena *a, Diag *d, const Source *src) {
  Parser P = {.a = a, .d = d, .src = src};
  P.g = graph_new(a, d);
  jmp_buf jb, *saved = d->jmp;
  d->jmp = &jb;
  if (setjmp(jb)) {
    d->jmp = saved;
    return NULL;
  }
  parse_all(&P);
  d->jmp = saved;
  return P.g;
}
