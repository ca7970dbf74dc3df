/* frontend/parser.y: grammar of the .model language (pure bison parser).
 *
 *   file    -> 'model' IDENT stmt*
 *   stmt    -> 'const' IDENT '=' expr
 *            | 'import' STRING
 *            | IDENT (',' IDENT)+ '=' expr              (destructuring a tuple)
 *            | IDENT '{' (IDENT '=' expr)* '}'          (the eval section)
 *            | 'input' IDENT ':' IDENT '[' exprs ']'
 *            | 'param' IDENT ':' IDENT? '[' exprs ']' ('=' expr)?
 *            | 'block' IDENT '(' params? ')' '{' stmt* 'return' expr (',' expr)* '}'
 *            | IDENT '=' expr
 *            | 'train' '{' (IDENT '=' expr)* '}'
 *   expr    -> expr ('+'|'-') expr | expr ('*'|'/'|'@') expr | '-' expr
 *            | NUMBER | STRING | IDENT | IDENT '(' args? ')' | '(' expr ')'
 *            | '@device' '(' expr ')' expr              (a device hint: @device(1) f(x))
 *   args    -> arg (',' arg)*        arg -> expr | IDENT '=' expr
 *
 * '@' binds like '*' (as in Python); unary minus binds tighter. */
%code requires {
#include "ast.h"
typedef void *yyscan_t;
}

%code {
#include <string.h>
int yylex(YYSTYPE *lval, YYLTYPE *lloc, yyscan_t scanner);
static Loc mkloc(ParseCtx *cx, YYLTYPE l) {
  Loc r = {cx->src, l.first_line, l.first_column};
  return r;
}
static void yyerror(YYLTYPE *l, yyscan_t sc, ParseCtx *cx, const char *msg);
#define YYMAXDEPTH 100000
}

%define api.pure full
%define parse.error custom
%locations
%param {yyscan_t scanner}
%parse-param {ParseCtx *cx}
%defines

%union {
  struct { double v; bool is_int; } num;
  char *str;
  Node *node;
  List list;
}

%token MODEL "'model'" CONST "'const'" INPUT "'input'" PARAM "'param'"
%token BLOCK "'block'" RETURN "'return'" TRAIN "'train'" IMPORT "'import'" DEVICE_HINT "'@device'"
%token <num> NUMBER "number"
%token <str> IDENT "identifier" STRING "string"

%type <node> stmt expr arg param block_param kv
%type <list> stmts exprs args_opt args params_opt params kvs names

%left '+' '-'
%left '*' '/' '@'
%precedence NEG

%%

file
  : MODEL IDENT stmts   { cx->model_name = $2; cx->model_loc = mkloc(cx, @2); cx->stmts = $3; }
  ;

stmts
  : %empty              { $$ = (List){0}; }
  | stmts stmt          { $$ = list_push($1, $2); }
  ;

stmt
  : CONST IDENT '=' expr {
      $$ = ast_new(cx, N_CONST, mkloc(cx, @2)); $$->name = $2; $$->a = $4; }
  | INPUT IDENT ':' IDENT '[' exprs ']' {
      $$ = ast_new(cx, N_INPUT, mkloc(cx, @2)); $$->name = $2; $$->dtype = $4;
      $$->dtype_loc = mkloc(cx, @4); $$->args = $6; }
  | PARAM IDENT ':' '[' exprs ']' param {
      $$ = ast_new(cx, N_PARAM, mkloc(cx, @2)); $$->name = $2; $$->args = $5; $$->a = $7; }
  | PARAM IDENT ':' IDENT '[' exprs ']' param {
      $$ = ast_new(cx, N_PARAM, mkloc(cx, @2)); $$->name = $2; $$->dtype = $4;
      $$->dtype_loc = mkloc(cx, @4); $$->args = $6; $$->a = $8; }
  | BLOCK IDENT '(' params_opt ')' '{' stmts RETURN exprs '}' {
      $$ = ast_new(cx, N_BLOCK, mkloc(cx, @2)); $$->name = $2; $$->args = $4;
      $$->body = $7;
      if ($9.n == 1) $$->a = $9.head;
      else { $$->a = ast_new(cx, N_TUPLE, $9.head->loc); $$->a->args = $9; } }
  | IMPORT STRING {
      $$ = ast_new(cx, N_IMPORT, mkloc(cx, @2)); $$->str = $2; }
  | names '=' expr {
      $$ = ast_new(cx, N_DESTRUCT, $1.head->loc); $$->args = $1; $$->a = $3; }
  | IDENT '{' kvs '}' {
      $$ = ast_new(cx, N_SECTION, mkloc(cx, @1)); $$->name = $1; $$->body = $3; }
  | IDENT '=' expr {
      $$ = ast_new(cx, N_ASSIGN, mkloc(cx, @1)); $$->name = $1; $$->a = $3; }
  | TRAIN '{' kvs '}' {
      $$ = ast_new(cx, N_TRAIN, mkloc(cx, @1)); $$->body = $3; }
  ;

names
  : IDENT ',' IDENT     {
      Node *a = ast_new(cx, N_IDENT, mkloc(cx, @1)), *b = ast_new(cx, N_IDENT, mkloc(cx, @3));
      a->name = $1; b->name = $3; $$ = list_push(list_one(a), b); }
  | names ',' IDENT     {
      Node *c = ast_new(cx, N_IDENT, mkloc(cx, @3)); c->name = $3; $$ = list_push($1, c); }
  ;

param
  : %empty              { $$ = NULL; }
  | '=' expr            { $$ = $2; }
  ;

params_opt
  : %empty              { $$ = (List){0}; }
  | params              { $$ = $1; }
  ;

params
  : block_param             { $$ = list_one($1); }
  | params ',' block_param  { $$ = list_push($1, $3); }
  ;

block_param
  : IDENT               { $$ = ast_new(cx, N_IDENT, mkloc(cx, @1)); $$->name = $1; }
  | IDENT '=' expr      { $$ = ast_new(cx, N_NAMED, mkloc(cx, @1)); $$->name = $1; $$->a = $3; }
  ;

kvs
  : %empty              { $$ = (List){0}; }
  | kvs kv              { $$ = list_push($1, $2); }
  | kvs ',' kv          { $$ = list_push($1, $3); }
  ;

kv
  : IDENT '=' expr      { $$ = ast_new(cx, N_NAMED, mkloc(cx, @1)); $$->name = $1; $$->a = $3; }
  ;

exprs
  : expr                { $$ = list_one($1); }
  | exprs ',' expr      { $$ = list_push($1, $3); }
  ;

args_opt
  : %empty              { $$ = (List){0}; }
  | args                { $$ = $1; }
  ;

args
  : arg                 { $$ = list_one($1); }
  | args ',' arg        { $$ = list_push($1, $3); }
  ;

arg
  : expr                { $$ = $1; }
  | IDENT '=' expr      { $$ = ast_new(cx, N_NAMED, mkloc(cx, @1)); $$->name = $1; $$->a = $3; }
  | BLOCK '=' expr      { $$ = ast_new(cx, N_NAMED, mkloc(cx, @1)); $$->name = "block"; $$->a = $3; }
  ;

expr
  : expr '+' expr       { $$ = ast_new(cx, N_BINOP, mkloc(cx, @2)); $$->op = '+'; $$->a = $1; $$->b = $3; }
  | expr '-' expr       { $$ = ast_new(cx, N_BINOP, mkloc(cx, @2)); $$->op = '-'; $$->a = $1; $$->b = $3; }
  | expr '*' expr       { $$ = ast_new(cx, N_BINOP, mkloc(cx, @2)); $$->op = '*'; $$->a = $1; $$->b = $3; }
  | expr '/' expr       { $$ = ast_new(cx, N_BINOP, mkloc(cx, @2)); $$->op = '/'; $$->a = $1; $$->b = $3; }
  | expr '@' expr       { $$ = ast_new(cx, N_BINOP, mkloc(cx, @2)); $$->op = '@'; $$->a = $1; $$->b = $3; }
  | '-' expr %prec NEG  { $$ = ast_new(cx, N_NEG, mkloc(cx, @1)); $$->a = $2; }
  | DEVICE_HINT '(' expr ')' expr %prec NEG {
      $$ = ast_new(cx, N_HINT, mkloc(cx, @1)); $$->name = "device"; $$->b = $3; $$->a = $5; }
  | '(' expr ')'        { $$ = $2; }
  | NUMBER              { $$ = ast_new(cx, N_NUM, mkloc(cx, @1)); $$->num = $1.v; $$->num_is_int = $1.is_int; }
  | STRING              { $$ = ast_new(cx, N_STR, mkloc(cx, @1)); $$->str = $1; }
  | IDENT               { $$ = ast_new(cx, N_IDENT, mkloc(cx, @1)); $$->name = $1; }
  | IDENT '(' args_opt ')' {
      $$ = ast_new(cx, N_CALL, mkloc(cx, @1)); $$->name = $1; $$->args = $3; }
  ;

%%

Node *ast_new(ParseCtx *cx, NodeKind k, Loc loc) {
  Node *n = arena_alloc(cx->arena, sizeof *n);
  n->kind = k;
  n->loc = loc;
  return n;
}

List list_one(Node *n) {
  List l = {n, n, 1};
  return l;
}

List list_push(List l, Node *n) {
  if (!l.head) return list_one(n);
  l.tail->next = n;
  l.tail = n;
  l.n++;
  return l;
}

static void report(ParseCtx *cx, YYLTYPE l, const char *fmt, const char *a, const char *b) {
  Diag *d = cx->diag;
  jmp_buf *j = d->jmp;
  d->jmp = NULL; /* return into bison so it frees its stacks */
  diag_error(d, mkloc(cx, l), fmt, a, b);
  d->jmp = j;
  cx->failed = true;
}

static void yyerror(YYLTYPE *l, yyscan_t sc, ParseCtx *cx, const char *msg) {
  (void)sc;
  if (!strcmp(msg, "memory exhausted"))
    report(cx, *l, "%s%s", "nesting too deep (the parser's stack is exhausted)", "");
  else
    report(cx, *l, "%s%s", msg, "");
}

/* "expected X, found Y" with the token names given in %token above. */
static int yyreport_syntax_error(const yypcontext_t *ctx, yyscan_t sc, ParseCtx *cx) {
  (void)sc;
  yysymbol_kind_t exp[7];
  int n = yypcontext_expected_tokens(ctx, exp, 7);
  yysymbol_kind_t got = yypcontext_token(ctx);
  char want[256] = "";
  if (n > 0 && n <= 6) {
    size_t k = 0;
    for (int i = 0; i < n && k < sizeof want; i++)
      k += (size_t)snprintf(want + k, sizeof want - k, "%s%s", i ? (i == n - 1 ? " or " : ", ") : "",
                            yysymbol_name(exp[i]));
  }
  char msg[400];
  const char *gotname = got == YYSYMBOL_YYEOF ? "end of file" : yysymbol_name(got);
  if (want[0])
    snprintf(msg, sizeof msg, "expected %s, found %s", want, gotname);
  else
    snprintf(msg, sizeof msg, "unexpected %s", gotname);
  report(cx, *yypcontext_location(ctx), "%s%s", msg, "");
  return 0;
}
