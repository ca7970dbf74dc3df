/* frontend/ast.h: the syntax tree shared by the lexer, the parser and the
 * elaborator (internal to frontend/). */
#ifndef DUET_AST_H
#define DUET_AST_H

#include "../ir/ir.h"

typedef enum NodeKind {
  N_NUM,    /* num */
  N_STR,    /* str */
  N_IDENT,  /* name */
  N_CALL,   /* name(args): args = list of exprs and N_NAMED */
  N_NAMED,  /* name = a (a named argument, a train key or a default param) */
  N_BINOP,  /* a op b, op one of + - * / @ */
  N_NEG,    /* -a */
  N_CONST,  /* const name = a */
  N_INPUT,  /* input name: dtype[dims] */
  N_PARAM,  /* param name: dtype?[dims] = a? */
  N_BLOCK,  /* block name(params) { body; return a } */
  N_ASSIGN, /* name = a */
  N_TRAIN,  /* train { body (N_NAMED) } */
  N_TUPLE,  /* a, b, ...: args (a block's multiple results) */
  N_DESTRUCT, /* names (args, N_IDENT) = a */
  N_SECTION,  /* name { body (N_NAMED) }: the eval section */
  N_IMPORT,   /* import "str" */
  N_HINT,     /* @name(b) a: a device hint on an expression */
} NodeKind;

typedef struct Node Node;
typedef struct List {
  Node *head, *tail;
  int n;
} List;

struct Node {
  NodeKind kind;
  Loc loc;
  const char *name;
  const char *dtype; /* N_INPUT, N_PARAM: dtype name or NULL */
  Loc dtype_loc;
  double num;
  bool num_is_int; /* N_NUM: written without '.' or exponent */
  const char *str;
  int op;          /* N_BINOP */
  Node *a, *b;
  List args;       /* N_CALL: arguments; N_BLOCK: parameters; N_INPUT/N_PARAM: dims */
  List body;       /* N_BLOCK, N_TRAIN */
  Node *next;      /* next in a List */
};

typedef struct ParseCtx {
  Arena *arena;
  Diag *diag;
  const Source *src;
  const char *model_name;
  Loc model_loc;
  List stmts;
  bool failed;
} ParseCtx;

Node *ast_new(ParseCtx *cx, NodeKind k, Loc loc);
List list_one(Node *n);
List list_push(List l, Node *n);

#endif
