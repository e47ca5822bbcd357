#include "io/pickle.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include "tvc/internal/tensor_impl.h"

namespace tvc::io {

// ---------------------------------------------------------------- PickleInput

namespace {
constexpr size_t kWindow = size_t{1} << 16;
}  // namespace

PickleInput::PickleInput(const InputFile& file, uint64_t offset)
    : file_(&file), offset_(offset), size_(offset <= file.size() ? file.size() - offset : 0) {}

void PickleInput::read(void* dst, size_t n) {
  auto* out = static_cast<uint8_t*>(dst);
  if (!file_) {
    std::memcpy(out, data_ + position_, n);
  } else if (n > kWindow) {  // a long string: straight from the file
    file_->read(offset_ + position_, out, n, "pickle data");
  } else {
    if (position_ < window_start_ || position_ + n > window_start_ + window_.size()) {
      window_start_ = position_;
      window_ = file_->read(offset_ + position_, static_cast<size_t>(std::min<uint64_t>(kWindow, remaining())),
                            "pickle data");
    }
    std::memcpy(out, window_.data() + (position_ - window_start_), n);
  }
  position_ += n;
}

// ---------------------------------------------------------------- unpickler objects

namespace {

constexpr size_t kMaxDepth = 1000;  // nesting of containers, and open marks
constexpr size_t kMaxStack = size_t{1} << 20;
constexpr size_t kMaxMemo = size_t{1} << 20;
constexpr uint64_t kMaxObjects = uint64_t{1} << 24;  // objects one pickle may create
// Nodes of the value tree counting shared subtrees once per use, so a pickle reusing memoized
// containers cannot make a tree whose traversal (flatten_tensors, ==) is exponential.
constexpr uint64_t kMaxTreeSize = uint64_t{1} << 26;
// Likewise for the str/bytes content of the tree (one memoized string used a million times
// would otherwise be copied a million times), and for the text hashed as dict and set keys.
constexpr uint64_t kMaxTreeBytes = uint64_t{1} << 30;
constexpr uint64_t kMaxKeyBytes = uint64_t{1} << 28;

struct Obj;
using ObjPtr = std::shared_ptr<Obj>;

// An object on the unpickler's stack or inside its containers.
struct Obj {
  enum class Kind { Leaf, List, Tuple, Set, Dict, Global, Storage, Tensor, Object, NumpyDType, NumpyArray };
  Kind kind = Kind::Leaf;
  Value leaf;                                     // Leaf: None, bool, int, float, str, bytes
  std::vector<ObjPtr> elements;                   // List, Tuple, Set; Object: appended items
  std::vector<std::pair<ObjPtr, ObjPtr>> items;   // Dict; Object: set items
  std::unordered_map<std::string, size_t> index;  // Dict, Object: key text -> item; Set: element text
  bool ordered = false;                           // Dict: an OrderedDict
  std::string global;                             // Global, Object: "module.name"
  bool opaque = false;                            // Global: outside the allow-list (opaque mode)
  // Object: how the placeholder was made, and what the pickle gave it.
  OpaqueObject::Made made = OpaqueObject::Made::Global;
  std::vector<ObjPtr> args;
  ObjPtr state;  // BUILD's, null until then
  // NumpyDType: NumPy's type code ("f8", "U10", "O8"), byte order ('<', '>', '|') and item size
  // (0 until known); structured dtypes (with fields) are kept only as opaque data.
  std::string np_code;
  char np_order = '|';
  uint64_t np_itemsize = 0;
  bool np_structured = false;
  // Tensor made from a NumPy array: its dtype text ("<u4"), for the raw fallback when tvc has no
  // dtype for it (see Converter).
  std::string np_dtype;
  // Storage and Tensor
  std::shared_ptr<Storage> storage;
  FileDType dtype = FileDType::Float32;
  uint64_t numel = 0;  // elements of the storage
  // Tensor
  int64_t offset = 0;
  Shape sizes, strides;
  bool requires_grad = false;

  // A container is mutable until it is put into another one (the pickler always completes an
  // object before its parent takes it), which rules out cycles; its depth and tree size are
  // then final.
  bool frozen = false;
  size_t depth = 0;
  uint64_t tree_size = 1;
  uint64_t tree_bytes = 0;  // of str and bytes
};

const char* kind_name(const Obj& o) {
  switch (o.kind) {
    case Obj::Kind::Leaf:
      return o.leaf.kind_name();
    case Obj::Kind::List:
      return "list";
    case Obj::Kind::Tuple:
      return "tuple";
    case Obj::Kind::Set:
      return "set";
    case Obj::Kind::Dict:
      return o.ordered ? "OrderedDict" : "dict";
    case Obj::Kind::Global:
      return "class or function";
    case Obj::Kind::Storage:
      return "storage";
    case Obj::Kind::Tensor:
      return "Tensor";
    case Obj::Kind::Object:
      return "opaque object";
    case Obj::Kind::NumpyDType:
      return "numpy.dtype";
    case Obj::Kind::NumpyArray:
      return "numpy.ndarray";
  }
  return "?";
}

bool is_leaf(const Obj& o, Value::Kind kind) { return o.kind == Obj::Kind::Leaf && o.leaf.kind() == kind; }

// The opcodes of pickle protocols 0-5 by byte, null for bytes that are none.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case '(':
      return "MARK";
    case '.':
      return "STOP";
    case '0':
      return "POP";
    case '1':
      return "POP_MARK";
    case '2':
      return "DUP";
    case 'F':
      return "FLOAT";
    case 'I':
      return "INT";
    case 'J':
      return "BININT";
    case 'K':
      return "BININT1";
    case 'L':
      return "LONG";
    case 'M':
      return "BININT2";
    case 'N':
      return "NONE";
    case 'P':
      return "PERSID";
    case 'Q':
      return "BINPERSID";
    case 'R':
      return "REDUCE";
    case 'S':
      return "STRING";
    case 'T':
      return "BINSTRING";
    case 'U':
      return "SHORT_BINSTRING";
    case 'V':
      return "UNICODE";
    case 'X':
      return "BINUNICODE";
    case 'a':
      return "APPEND";
    case 'b':
      return "BUILD";
    case 'c':
      return "GLOBAL";
    case 'd':
      return "DICT";
    case '}':
      return "EMPTY_DICT";
    case 'e':
      return "APPENDS";
    case 'g':
      return "GET";
    case 'h':
      return "BINGET";
    case 'i':
      return "INST";
    case 'j':
      return "LONG_BINGET";
    case 'l':
      return "LIST";
    case ']':
      return "EMPTY_LIST";
    case 'o':
      return "OBJ";
    case 'p':
      return "PUT";
    case 'q':
      return "BINPUT";
    case 'r':
      return "LONG_BINPUT";
    case 's':
      return "SETITEM";
    case 't':
      return "TUPLE";
    case ')':
      return "EMPTY_TUPLE";
    case 'u':
      return "SETITEMS";
    case 'G':
      return "BINFLOAT";
    case 0x80:
      return "PROTO";
    case 0x81:
      return "NEWOBJ";
    case 0x82:
      return "EXT1";
    case 0x83:
      return "EXT2";
    case 0x84:
      return "EXT4";
    case 0x85:
      return "TUPLE1";
    case 0x86:
      return "TUPLE2";
    case 0x87:
      return "TUPLE3";
    case 0x88:
      return "NEWTRUE";
    case 0x89:
      return "NEWFALSE";
    case 0x8a:
      return "LONG1";
    case 0x8b:
      return "LONG4";
    case 'B':
      return "BINBYTES";
    case 'C':
      return "SHORT_BINBYTES";
    case 0x8c:
      return "SHORT_BINUNICODE";
    case 0x8d:
      return "BINUNICODE8";
    case 0x8e:
      return "BINBYTES8";
    case 0x8f:
      return "EMPTY_SET";
    case 0x90:
      return "ADDITEMS";
    case 0x91:
      return "FROZENSET";
    case 0x92:
      return "NEWOBJ_EX";
    case 0x93:
      return "STACK_GLOBAL";
    case 0x94:
      return "MEMOIZE";
    case 0x95:
      return "FRAME";
    case 0x96:
      return "BYTEARRAY8";
    case 0x97:
      return "NEXT_BUFFER";
    case 0x98:
      return "READONLY_BUFFER";
    default:
      return nullptr;
  }
}

// Python 3 reads protocol 0-2 pickles with fix_imports: Python 2 names become Python 3's
// (_compat_pickle's NAME_MAPPING, its exceptions.* -> builtins.*, then IMPORT_MAPPING). Protocol 2
// writers apply the reverse (subprocess.Popen is written commands.Popen), so the allow-list and
// the placeholders go by the name Python 3 would resolve.
std::string python3_name(const std::string& module, const std::string& name) {
  static const std::unordered_map<std::string, std::string> kNames = {
      {"__builtin__.xrange", "builtins.range"},
      {"__builtin__.reduce", "functools.reduce"},
      {"__builtin__.intern", "sys.intern"},
      {"__builtin__.unichr", "builtins.chr"},
      {"__builtin__.unicode", "builtins.str"},
      {"__builtin__.long", "builtins.int"},
      {"itertools.izip", "builtins.zip"},
      {"itertools.imap", "builtins.map"},
      {"itertools.ifilter", "builtins.filter"},
      {"itertools.ifilterfalse", "itertools.filterfalse"},
      {"itertools.izip_longest", "itertools.zip_longest"},
      {"UserDict.IterableUserDict", "collections.UserDict"},
      {"UserList.UserList", "collections.UserList"},
      {"UserString.UserString", "collections.UserString"},
      {"whichdb.whichdb", "dbm.whichdb"},
      {"_socket.fromfd", "socket.fromfd"},
      {"_multiprocessing.Connection", "multiprocessing.connection.Connection"},
      {"multiprocessing.process.Process", "multiprocessing.context.Process"},
      {"multiprocessing.forking.Popen", "multiprocessing.popen_fork.Popen"},
      {"urllib.ContentTooShortError", "urllib.error.ContentTooShortError"},
      {"urllib.getproxies", "urllib.request.getproxies"},
      {"urllib.pathname2url", "urllib.request.pathname2url"},
      {"urllib.quote_plus", "urllib.parse.quote_plus"},
      {"urllib.quote", "urllib.parse.quote"},
      {"urllib.unquote_plus", "urllib.parse.unquote_plus"},
      {"urllib.unquote", "urllib.parse.unquote"},
      {"urllib.url2pathname", "urllib.request.url2pathname"},
      {"urllib.urlcleanup", "urllib.request.urlcleanup"},
      {"urllib.urlencode", "urllib.parse.urlencode"},
      {"urllib.urlopen", "urllib.request.urlopen"},
      {"urllib.urlretrieve", "urllib.request.urlretrieve"},
      {"urllib2.HTTPError", "urllib.error.HTTPError"},
      {"urllib2.URLError", "urllib.error.URLError"},
      {"multiprocessing.AuthenticationError", "multiprocessing.context.AuthenticationError"},
      {"multiprocessing.BufferTooShort", "multiprocessing.context.BufferTooShort"},
      {"multiprocessing.ProcessError", "multiprocessing.context.ProcessError"},
      {"multiprocessing.TimeoutError", "multiprocessing.context.TimeoutError"},
      {"__builtin__.basestring", "builtins.str"},
      {"exceptions.StandardError", "builtins.Exception"},
      {"UserDict.UserDict", "collections.UserDict"},
      {"socket._socketobject", "socket.SocketType"}};
  static const std::unordered_map<std::string, std::string> kModules = {{"__builtin__", "builtins"},
                                                                        {"copy_reg", "copyreg"},
                                                                        {"Queue", "queue"},
                                                                        {"SocketServer", "socketserver"},
                                                                        {"ConfigParser", "configparser"},
                                                                        {"repr", "reprlib"},
                                                                        {"tkFileDialog", "tkinter.filedialog"},
                                                                        {"tkSimpleDialog", "tkinter.simpledialog"},
                                                                        {"tkColorChooser", "tkinter.colorchooser"},
                                                                        {"tkCommonDialog", "tkinter.commondialog"},
                                                                        {"Dialog", "tkinter.dialog"},
                                                                        {"Tkdnd", "tkinter.dnd"},
                                                                        {"tkFont", "tkinter.font"},
                                                                        {"tkMessageBox", "tkinter.messagebox"},
                                                                        {"ScrolledText", "tkinter.scrolledtext"},
                                                                        {"Tkconstants", "tkinter.constants"},
                                                                        {"Tix", "tkinter.tix"},
                                                                        {"ttk", "tkinter.ttk"},
                                                                        {"Tkinter", "tkinter"},
                                                                        {"markupbase", "_markupbase"},
                                                                        {"_winreg", "winreg"},
                                                                        {"thread", "_thread"},
                                                                        {"dummy_thread", "_dummy_thread"},
                                                                        {"dbhash", "dbm.bsd"},
                                                                        {"dumbdbm", "dbm.dumb"},
                                                                        {"dbm", "dbm.ndbm"},
                                                                        {"gdbm", "dbm.gnu"},
                                                                        {"xmlrpclib", "xmlrpc.client"},
                                                                        {"SimpleXMLRPCServer", "xmlrpc.server"},
                                                                        {"httplib", "http.client"},
                                                                        {"htmlentitydefs", "html.entities"},
                                                                        {"HTMLParser", "html.parser"},
                                                                        {"Cookie", "http.cookies"},
                                                                        {"cookielib", "http.cookiejar"},
                                                                        {"BaseHTTPServer", "http.server"},
                                                                        {"test.test_support", "test.support"},
                                                                        {"commands", "subprocess"},
                                                                        {"urlparse", "urllib.parse"},
                                                                        {"robotparser", "urllib.robotparser"},
                                                                        {"urllib2", "urllib.request"},
                                                                        {"anydbm", "dbm"},
                                                                        {"_abcoll", "collections.abc"},
                                                                        {"cPickle", "pickle"},
                                                                        {"_elementtree", "xml.etree.ElementTree"},
                                                                        {"FileDialog", "tkinter.filedialog"},
                                                                        {"SimpleDialog", "tkinter.simpledialog"},
                                                                        {"DocXMLRPCServer", "xmlrpc.server"},
                                                                        {"SimpleHTTPServer", "http.server"},
                                                                        {"CGIHTTPServer", "http.server"},
                                                                        {"UserDict", "collections"},
                                                                        {"UserList", "collections"},
                                                                        {"UserString", "collections"},
                                                                        {"whichdb", "dbm"},
                                                                        {"StringIO", "io"},
                                                                        {"cStringIO", "io"}};
  std::string full = module + "." + name;
  if (auto it = kNames.find(full); it != kNames.end()) return it->second;
  if (module == "exceptions") return "builtins." + name;
  if (auto it = kModules.find(module); it != kModules.end()) return it->second + "." + name;
  return full;
}

size_t element_bytes(FileDType dtype) { return static_cast<size_t>(bit_size(dtype) / 8); }

}  // namespace

// ---------------------------------------------------------------- Unpickler

struct Unpickler::State {
  std::string file, source;
  PersistentLoad persistent_load;
  bool opaque = false;  // ReadOptions::opaque_objects
  PickleInput* in = nullptr;
  uint64_t op_position = 0;  // of the opcode being run
  const char* op = "";
  std::vector<ObjPtr> stack;
  std::vector<size_t> marks;  // stack sizes at each MARK
  std::unordered_map<uint64_t, ObjPtr> memo;
  uint64_t objects = 0;
  uint64_t key_bytes = 0;  // hashed as dict and set keys
  ObjPtr result;

  // "'model.pth': archive/data.pkl", the start of every error message.
  std::string where() const { return cat_str("'", printable(file), "': ", printable(source)); }
  [[noreturn]] void fail(const std::string& message) const {
    throw Error(cat_str(where(), ": ", message, " (", op, " at byte ", op_position, ")"));
  }

  // ---- input
  void need(uint64_t n) const {
    if (n > in->remaining())
      fail(
          cat_str("needs ", n, " more bytes but the pickle has ", in->remaining(), " left: past the end (truncated?)"));
  }
  uint64_t read_uint(size_t n) {  // little-endian
    need(n);
    uint8_t b[8] = {};
    in->read(b, n);
    uint64_t v = 0;
    for (size_t i = n; i-- > 0;) v = v << 8 | b[i];
    return v;
  }
  std::string read_string(uint64_t n) {
    need(n);  // before allocating
    std::string s(static_cast<size_t>(n), '\0');
    in->read(s.data(), s.size());
    return s;
  }
  std::string read_line() {  // GLOBAL's "module\n" and "name\n"
    std::string s;
    for (;;) {
      need(1);
      char c;
      in->read(&c, 1);
      if (c == '\n') return s;
      if (s.size() >= 256) fail("GLOBAL name longer than 256 bytes");
      s += c;
    }
  }

  // ---- objects
  ObjPtr make(Obj::Kind kind) {
    if (++objects > kMaxObjects) fail(cat_str("more than ", kMaxObjects, " objects"));
    auto o = std::make_shared<Obj>();
    o->kind = kind;
    return o;
  }
  ObjPtr leaf(Value v) {
    ObjPtr o = make(Obj::Kind::Leaf);
    if (v.kind() == Value::Kind::String || v.kind() == Value::Kind::Bytes) o->tree_bytes = v.to_string().size();
    o->leaf = std::move(v);
    return o;
  }
  void push(ObjPtr o) {
    if (stack.size() >= kMaxStack) fail(cat_str("the stack holds more than ", kMaxStack, " objects"));
    stack.push_back(std::move(o));
  }
  size_t frame_start() const { return marks.empty() ? 0 : marks.back(); }
  ObjPtr pop() {
    if (stack.size() <= frame_start()) fail("stack underflow: no object to pop");
    ObjPtr o = std::move(stack.back());
    stack.pop_back();
    return o;
  }
  ObjPtr& top() {
    if (stack.size() <= frame_start()) fail("stack underflow: no object on the stack");
    return stack.back();
  }
  std::vector<ObjPtr> pop_mark() {
    if (marks.empty()) fail("no MARK to pop to (stack underflow)");
    size_t start = marks.back();
    marks.pop_back();
    std::vector<ObjPtr> items(std::make_move_iterator(stack.begin() + static_cast<std::ptrdiff_t>(start)),
                              std::make_move_iterator(stack.end()));
    stack.resize(start);
    return items;
  }

  // Puts child into the container parent (which must still be mutable), freezing the child.
  void adopt(Obj& parent, const ObjPtr& child) {
    if (parent.frozen) fail(cat_str("modifies a ", kind_name(parent), " already inside another object"));
    if (&parent == child.get()) fail(cat_str("puts a ", kind_name(parent), " into itself"));
    child->frozen = true;
    parent.depth = std::max(parent.depth, child->depth + 1);
    if (parent.depth > kMaxDepth) fail(cat_str("objects nest deeper than ", kMaxDepth, " levels"));
    parent.tree_size += child->tree_size;
    if (parent.tree_size > kMaxTreeSize)
      fail(cat_str("the object tree has more than ", kMaxTreeSize, " nodes (shared objects counted at each use)"));
    parent.tree_bytes += child->tree_bytes;
    if (parent.tree_bytes > kMaxTreeBytes)
      fail(cat_str("the object tree holds more than ", kMaxTreeBytes,
                   " bytes of strings (shared ones counted at each use)"));
  }
  ObjPtr sequence(Obj::Kind kind, const std::vector<ObjPtr>& items) {
    ObjPtr o = make(kind);
    for (const ObjPtr& item : items) add_element(*o, item);
    return o;
  }
  void add_element(Obj& seq, const ObjPtr& item) {
    if (seq.kind == Obj::Kind::Set) {
      std::string text = key_text(*item, "set element");
      if (!seq.index.emplace(text, seq.elements.size()).second) return;  // already in the set
    }
    adopt(seq, item);
    seq.elements.push_back(item);
  }
  void set_item(Obj& dict, const ObjPtr& key, const ObjPtr& value) {
    std::string text = key_text(*key, "dict key");
    adopt(dict, key);
    adopt(dict, value);
    auto [it, added] = dict.index.emplace(text, dict.items.size());
    if (added)
      dict.items.emplace_back(key, value);
    else
      dict.items[it->second].second = value;  // Python: the last value of a key wins
  }
  // A text equal for keys Python finds equal (1 == 1.0 == True): dict and set keys must be
  // str, int, float, bool, None, bytes or tuples of those.
  std::string key_text(const Obj& key, const char* what) {
    if ((key_bytes += key.tree_bytes + key.tree_size) > kMaxKeyBytes)
      fail(cat_str("dict keys and set elements total more than ", kMaxKeyBytes, " bytes"));
    if (key.kind == Obj::Kind::Tuple) {
      std::string s = "(";
      for (const ObjPtr& e : key.elements) s += key_text(*e, what) + ",";
      return s + ")";
    }
    if (key.kind != Obj::Kind::Leaf)
      fail(cat_str("a ", what, " is a ", kind_name(key),
                   " (only str, int, float, bool, None, bytes and tuples are allowed)"));
    const Value& v = key.leaf;
    switch (v.kind()) {
      case Value::Kind::None:
        return "N";
      case Value::Kind::Bool:
        return cat_str("i", v.to_bool() ? 1 : 0);
      case Value::Kind::Int:
        return cat_str("i", v.to_int());
      case Value::Kind::Float: {
        double f = v.to_float();
        if (f >= -9.2e18 && f <= 9.2e18 && f == static_cast<double>(static_cast<int64_t>(f)))
          return cat_str("i", static_cast<int64_t>(f));
        uint64_t bits;
        std::memcpy(&bits, &f, 8);
        return cat_str("f", bits);
      }
      // Length-prefixed, so that tuples of strings cannot collide.
      case Value::Kind::String:
        return cat_str("s", v.to_string().size(), ":", v.to_string());
      default:
        return cat_str("b", v.to_string().size(), ":", v.to_string());  // bytes
    }
  }

  // ---- the opcodes
  void run();
  void memo_put(uint64_t index) {
    if (!memo.count(index) && memo.size() >= kMaxMemo) fail(cat_str("the memo holds more than ", kMaxMemo, " objects"));
    memo[index] = top();
  }
  void memo_get(uint64_t index) {
    auto it = memo.find(index);
    if (it == memo.end()) fail(cat_str("memo index ", index, " is not defined (memo index out of range)"));
    push(it->second);
  }
  void global(const std::string& module, const std::string& name);
  void reduce(const Obj& callable, const Obj& args);
  void rebuild_tensor(const std::vector<ObjPtr>& args, const std::string& function);
  void persistent_id(const Obj& pid);
  void build(Obj& target, const ObjPtr& state);
  // Opaque placeholders: a call or instance of an opaque global, and the items put into one.
  void opaque_object(const Obj& global, OpaqueObject::Made made, const Obj& args);
  static bool takes_items(const Obj& o) { return o.kind == Obj::Kind::Object && o.made != OpaqueObject::Made::Global; }
  // NumPy: dtype(code, align, copy); the ndarray state (version, shape, dtype, fortran, data)
  // into a tensor or raw data; scalar(dtype, data) into a number or raw data.
  void numpy_dtype(const std::vector<ObjPtr>& args);
  void numpy_dtype_state(Obj& dtype, const Obj& state);
  ObjPtr numpy_array(const Obj& state);
  ObjPtr numpy_scalar(const std::vector<ObjPtr>& args);
  ObjPtr numpy_raw(const char* global, const std::string& dtype_text, const Shape* shape, bool fortran,
                   const ObjPtr& data);
  std::optional<FileDType> numpy_numeric(const Obj& dtype) const;
};

void Unpickler::State::global(const std::string& module, const std::string& name) {
  static const char* const kAllowed[] = {"collections.OrderedDict",
                                         "torch._utils._rebuild_tensor_v2",
                                         "torch._utils._rebuild_tensor",
                                         "torch._utils._rebuild_parameter",
                                         "torch._utils._rebuild_parameter_with_state",
                                         "_codecs.encode",
                                         "builtins.set",
                                         "builtins.frozenset",
                                         "builtins.bytes"};
  // NumPy's data types (NumPy 2 renamed numpy.core to numpy._core): decoded, never called.
  static const char* const kNumpy[] = {"numpy.core.multiarray._reconstruct", "numpy.core.multiarray.scalar",
                                       "numpy.ndarray", "numpy.dtype"};
  std::string full = python3_name(module, name);
  if (full.rfind("numpy._core.", 0) == 0) full = "numpy.core." + full.substr(12);
  auto listed = [&](const auto& list) {
    return std::find_if(std::begin(list), std::end(list), [&](const char* a) { return full == a; }) != std::end(list);
  };
  bool allowed = listed(kAllowed) || listed(kNumpy);
  if (!allowed && module == "torch") allowed = file_dtype_from_torch_storage(name).has_value();
  if (!allowed && !opaque)
    fail(cat_str(op, " ", printable(full),
                 " is not allowed (only state_dict/checkpoint types are; ReadOptions::opaque_objects, `--opaque` on "
                 "the command line, reads such objects as data without importing or running anything)"));
  ObjPtr g = make(Obj::Kind::Global);
  g->global = full;
  g->opaque = !allowed;
  push(std::move(g));
}

void Unpickler::State::opaque_object(const Obj& global, OpaqueObject::Made made, const Obj& args) {
  if (args.kind != Obj::Kind::Tuple)
    fail(cat_str("the arguments of ", printable(global.global), " are a ", kind_name(args), ", not a tuple"));
  ObjPtr o = make(Obj::Kind::Object);
  o->global = global.global;
  o->made = made;
  for (const ObjPtr& a : args.elements) {
    adopt(*o, a);
    o->args.push_back(a);
  }
  push(std::move(o));
}

void Unpickler::State::reduce(const Obj& callable, const Obj& args_obj) {
  if (callable.kind != Obj::Kind::Global) fail(cat_str("calls a ", kind_name(callable), ", not a class or function"));
  if (callable.opaque) return opaque_object(callable, OpaqueObject::Made::Call, args_obj);
  if (args_obj.kind != Obj::Kind::Tuple)
    fail(cat_str("the arguments of ", callable.global, " are a ", kind_name(args_obj), ", not a tuple"));
  const std::string& f = callable.global;
  const std::vector<ObjPtr>& args = args_obj.elements;
  auto no_args = [&] {
    if (!args.empty()) fail(cat_str(f, " takes no arguments here, got ", args.size()));
  };
  if (f == "collections.OrderedDict") {
    no_args();
    ObjPtr d = make(Obj::Kind::Dict);
    d->ordered = true;
    push(std::move(d));
  } else if (f == "builtins.set" || f == "builtins.frozenset") {
    if (args.empty()) return push(make(Obj::Kind::Set));
    const Obj& items = *args[0];
    if (args.size() != 1 ||
        (items.kind != Obj::Kind::List && items.kind != Obj::Kind::Tuple && items.kind != Obj::Kind::Set))
      fail(cat_str(f, " takes one list, tuple or set"));
    push(sequence(Obj::Kind::Set, items.elements));
  } else if (f == "builtins.bytes") {
    no_args();
    push(leaf(Value::bytes("")));
  } else if (f == "_codecs.encode") {
    // Protocol 2 pickles bytes as _codecs.encode(<the bytes as a latin-1 str>, 'latin1').
    if (args.size() != 2 || !is_leaf(*args[0], Value::Kind::String) || !is_leaf(*args[1], Value::Kind::String) ||
        (args[1]->leaf.to_string() != "latin1" && args[1]->leaf.to_string() != "latin-1"))
      fail("_codecs.encode takes (str, 'latin1') only");
    const std::string& utf8 = args[0]->leaf.to_string();
    std::string bytes;
    for (size_t i = 0; i < utf8.size(); ++i) {
      auto c = static_cast<uint8_t>(utf8[i]);
      if (c < 0x80) {
        bytes += static_cast<char>(c);
      } else if ((c == 0xc2 || c == 0xc3) && i + 1 < utf8.size() &&
                 (static_cast<uint8_t>(utf8[i + 1]) & 0xc0) == 0x80) {
        bytes += static_cast<char>((c & 0x03) << 6 | (static_cast<uint8_t>(utf8[++i]) & 0x3f));
      } else {
        fail("_codecs.encode: the str is not latin-1");
      }
    }
    push(leaf(Value::bytes(std::move(bytes))));
  } else if (f == "torch._utils._rebuild_tensor_v2" || f == "torch._utils._rebuild_tensor") {
    rebuild_tensor(args, f);
  } else if (f == "numpy.dtype") {
    numpy_dtype(args);
  } else if (f == "numpy.core.multiarray._reconstruct") {
    // _reconstruct(numpy.ndarray, (0,), b'b'): an empty array that BUILD then fills.
    if (args.size() != 3 || args[0]->kind != Obj::Kind::Global || args[0]->global != "numpy.ndarray")
      fail(cat_str(f, " takes (numpy.ndarray, shape, dtype code); subclasses of ndarray are not supported"));
    push(make(Obj::Kind::NumpyArray));
  } else if (f == "numpy.core.multiarray.scalar") {
    push(numpy_scalar(args));
  } else if (f == "torch._utils._rebuild_parameter" || f == "torch._utils._rebuild_parameter_with_state") {
    // (data, requires_grad, backward_hooks[, state]): the tensor, marked as requiring grad.
    size_t n = f == "torch._utils._rebuild_parameter" ? 3 : 4;
    if (args.size() != n || args[0]->kind != Obj::Kind::Tensor || !is_leaf(*args[1], Value::Kind::Bool))
      fail(cat_str(f, " takes (Tensor, bool, hooks", n == 4 ? ", state" : "", ")"));
    for (size_t i = 2; i < n; ++i)
      if (!(is_leaf(*args[i], Value::Kind::None) || (args[i]->kind == Obj::Kind::Dict && args[i]->items.empty())))
        fail(cat_str(f, ": backward hooks and parameter state are not supported (they must be empty)"));
    ObjPtr p = make(Obj::Kind::Tensor);
    *p = *args[0];
    p->frozen = false;
    p->requires_grad = args[1]->leaf.to_bool();
    push(std::move(p));
  } else {
    fail(cat_str(f, " cannot be called"));
  }
}

void Unpickler::State::rebuild_tensor(const std::vector<ObjPtr>& args, const std::string& function) {
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
  // _rebuild_tensor(storage, offset, size, stride)
  bool v2 = function == "torch._utils._rebuild_tensor_v2";
  if (v2 ? args.size() != 6 && args.size() != 7 : args.size() != 4)
    fail(cat_str(function, " takes ", v2 ? "6 or 7" : "4", " arguments, got ", args.size()));
  const Obj& storage = *args[0];
  if (storage.kind != Obj::Kind::Storage) fail(cat_str(function, ": the storage is a ", kind_name(storage)));
  if (!is_leaf(*args[1], Value::Kind::Int) || args[2]->kind != Obj::Kind::Tuple || args[3]->kind != Obj::Kind::Tuple)
    fail(cat_str(function, " takes (storage, int offset, size tuple, stride tuple, ...)"));
  ObjPtr t = make(Obj::Kind::Tensor);
  t->storage = storage.storage;
  t->dtype = storage.dtype;
  t->numel = storage.numel;
  t->offset = args[1]->leaf.to_int();
  for (int which = 0; which < 2; ++which) {
    Shape& dims = which == 0 ? t->sizes : t->strides;
    for (const ObjPtr& d : args[2 + which]->elements) {
      if (!is_leaf(*d, Value::Kind::Int)) fail(cat_str(function, ": a size or stride is a ", kind_name(*d)));
      dims.push_back(d->leaf.to_int());
    }
  }
  if (v2) {
    if (!is_leaf(*args[4], Value::Kind::Bool)) fail(cat_str(function, ": requires_grad is a ", kind_name(*args[4])));
    t->requires_grad = args[4]->leaf.to_bool();
    for (size_t i = 5; i < args.size(); ++i)  // backward hooks, metadata
      if (!(is_leaf(*args[i], Value::Kind::None) || (args[i]->kind == Obj::Kind::Dict && args[i]->items.empty())))
        fail(cat_str(function, ": backward hooks and tensor metadata are not supported (they must be empty)"));
  }
  // The view must lie inside the storage: offset + sum((size - 1) * stride) < numel, computed
  // without overflow, unless the tensor is empty.
  if (t->sizes.size() != t->strides.size() || t->sizes.size() > 64)
    fail(cat_str(function, ": ", t->sizes.size(), " sizes and ", t->strides.size(), " strides"));
  if (t->offset < 0) fail(cat_str(function, ": negative storage offset ", t->offset));
  bool empty = false;
  for (size_t i = 0; i < t->sizes.size(); ++i) {
    if (t->sizes[i] < 0 || t->strides[i] < 0)
      fail(cat_str(function, ": negative size or stride (size ", t->sizes, ", stride ", t->strides, ")"));
    empty = empty || t->sizes[i] == 0;
  }
  uint64_t last = static_cast<uint64_t>(t->offset);
  bool overflow = false;
  if (!empty) {
    for (size_t i = 0; i < t->sizes.size(); ++i) {
      uint64_t step;
      overflow =
          overflow ||
          __builtin_mul_overflow(static_cast<uint64_t>(t->sizes[i] - 1), static_cast<uint64_t>(t->strides[i]), &step) ||
          __builtin_add_overflow(last, step, &last);
    }
  }
  // Element counts must also fit in int64 (tvc's numel).
  int64_t numel = 1;
  for (int64_t s : t->sizes) overflow = overflow || __builtin_mul_overflow(numel, s, &numel);
  if (overflow) fail(cat_str(function, ": size ", t->sizes, " with stride ", t->strides, " overflows"));
  if (empty ? last > t->numel : last >= t->numel)
    fail(cat_str(function, ": a tensor of size ", t->sizes, ", stride ", t->strides, " at offset ", t->offset,
                 " reaches element ", last, " of a storage of ", t->numel, " elements (storage too short)"));
  push(std::move(t));
}

void Unpickler::State::persistent_id(const Obj& pid) {
  if (!persistent_load) fail("a persistent id (tensor storage) is not expected in this pickle");
  const std::vector<ObjPtr>& f = pid.elements;
  // Legacy whole-model saves name each module class as ('module', class, source file, source
  // code), which torch.load resolves to the class (the source is only compared, never run).
  if (pid.kind == Obj::Kind::Tuple && f.size() == 4 && is_leaf(*f[0], Value::Kind::String) &&
      f[0]->leaf.to_string() == "module" && f[1]->kind == Obj::Kind::Global) {
    push(f[1]);
    return;
  }
  if (pid.kind != Obj::Kind::Tuple || (f.size() != 5 && f.size() != 6) || !is_leaf(*f[0], Value::Kind::String) ||
      f[0]->leaf.to_string() != "storage" || f[1]->kind != Obj::Kind::Global || !is_leaf(*f[2], Value::Kind::String) ||
      !is_leaf(*f[3], Value::Kind::String) || !is_leaf(*f[4], Value::Kind::Int) || f[4]->leaf.to_int() < 0)
    fail("a persistent id is not ('storage', torch.<type>Storage, key, location, numel[, view_metadata])");
  if (f.size() == 6 && !is_leaf(*f[5], Value::Kind::None))
    fail("storage views (persistent id view_metadata) are not supported");
  const std::string& type = f[1]->global;
  std::optional<FileDType> dtype;
  if (type.rfind("torch.", 0) == 0) dtype = file_dtype_from_torch_storage(type.substr(6));
  if (!dtype) fail(cat_str("the storage type ", type, " is not a torch storage"));
  PersistentId id{*dtype, f[2]->leaf.to_string(), f[3]->leaf.to_string(), static_cast<uint64_t>(f[4]->leaf.to_int())};
  ObjPtr s = make(Obj::Kind::Storage);
  s->storage = persistent_load(id);
  s->dtype = id.dtype;
  s->numel = id.numel;
  push(std::move(s));
}

// ---- NumPy

void Unpickler::State::numpy_dtype(const std::vector<ObjPtr>& args) {
  // dtype(code, align, copy), e.g. ('f8', False, True); the byte order and item size of flexible
  // types come with BUILD.
  if (args.size() != 3 || !is_leaf(*args[0], Value::Kind::String)) fail("numpy.dtype takes (type code, align, copy)");
  const std::string& code = args[0]->leaf.to_string();
  size_t letters = 0;
  while (letters < code.size() && std::isalpha(static_cast<unsigned char>(code[letters]))) ++letters;
  bool digits = std::all_of(code.begin() + static_cast<std::ptrdiff_t>(letters), code.end(),
                            [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  // Letters then at most 12 digits (an item size below 10^12 bytes, which std::stoull parses).
  if (letters == 0 || letters > 8 || !digits || code.size() - letters > 12)
    fail(cat_str("numpy.dtype: bad type code '", printable(code), "'"));
  ObjPtr d = make(Obj::Kind::NumpyDType);
  d->np_code = code;
  if (letters < code.size()) d->np_itemsize = std::stoull(code.substr(letters));
  push(std::move(d));
}

void Unpickler::State::numpy_dtype_state(Obj& dtype, const Obj& state) {
  // (version 3 or 4, byte order, subarray, names, fields, item size, alignment, flags[, metadata])
  const std::vector<ObjPtr>& f = state.elements;
  if (dtype.frozen) fail("BUILD of a numpy.dtype already inside another object");
  if (state.kind != Obj::Kind::Tuple || f.size() < 8 || !is_leaf(*f[0], Value::Kind::Int) ||
      !is_leaf(*f[1], Value::Kind::String) || f[1]->leaf.to_string().size() != 1 ||
      std::string("<>|=").find(f[1]->leaf.to_string()[0]) == std::string::npos || !is_leaf(*f[5], Value::Kind::Int))
    fail("numpy.dtype state is not (version, byte order, subarray, names, fields, item size, alignment, flags)");
  dtype.np_order = f[1]->leaf.to_string()[0];
  dtype.np_structured = !is_leaf(*f[2], Value::Kind::None) || !is_leaf(*f[3], Value::Kind::None);
  int64_t itemsize = f[5]->leaf.to_int();
  if (itemsize > 0) dtype.np_itemsize = static_cast<uint64_t>(itemsize);
}

// The FileDType of a plain numeric NumPy dtype (bool, ints, floats, complex), else none.
std::optional<FileDType> Unpickler::State::numpy_numeric(const Obj& dtype) const {
  if (dtype.np_structured) return std::nullopt;
  static const std::pair<const char*, FileDType> kTypes[] = {
      {"b1", FileDType::Bool},      {"u1", FileDType::UInt8},      {"i1", FileDType::Int8},
      {"i2", FileDType::Int16},     {"u2", FileDType::UInt16},     {"i4", FileDType::Int32},
      {"u4", FileDType::UInt32},    {"i8", FileDType::Int64},      {"u8", FileDType::UInt64},
      {"f2", FileDType::Float16},   {"f4", FileDType::Float32},    {"f8", FileDType::Float64},
      {"c8", FileDType::Complex64}, {"c16", FileDType::Complex128}};
  for (const auto& [code, type] : kTypes)
    if (dtype.np_code == code) return type;
  return std::nullopt;
}

namespace {

// "<f8", "|b1", "<U10": NumPy's dtype.str (flexible types carry their size in the code);
// little_endian: the text of the data once byte-swapped to little-endian.
std::string numpy_dtype_text(const Obj& dtype, bool little_endian = false) {
  char order = little_endian && dtype.np_order == '>' ? '<' : dtype.np_order;
  if (dtype.np_code.rfind('O', 0) == 0) return "|O";  // object references: no size in dtype.str
  return std::string(1, order == '=' ? '<' : order) + dtype.np_code;
}

// Reverses the bytes of each unit-byte group of data in place (big-endian NumPy data).
void byteswap(std::string& data, size_t unit) {
  if (unit <= 1) return;
  for (size_t i = 0; i + unit <= data.size(); i += unit) std::reverse(data.begin() + i, data.begin() + i + unit);
}

}  // namespace

// Raw NumPy data tvc has no type for: an opaque numpy.ndarray / numpy.scalar whose state is
// {"dtype": "<U3", "shape": (...), "fortran_order": bool, "data": bytes (or the list of an object
// array), in memory order}; a scalar has no shape or order.
ObjPtr Unpickler::State::numpy_raw(const char* global, const std::string& dtype_text, const Shape* shape, bool fortran,
                                   const ObjPtr& data) {
  ObjPtr o = make(Obj::Kind::Object);
  o->global = global;
  o->made = OpaqueObject::Made::New;
  ObjPtr state = make(Obj::Kind::Dict);
  set_item(*state, leaf(Value("dtype")), leaf(Value(dtype_text)));
  if (shape) {
    std::vector<ObjPtr> dims;
    for (int64_t d : *shape) dims.push_back(leaf(Value(d)));
    set_item(*state, leaf(Value("shape")), sequence(Obj::Kind::Tuple, dims));
    set_item(*state, leaf(Value("fortran_order")), leaf(Value(fortran)));
  }
  set_item(*state, leaf(Value("data")), data);
  adopt(*o, state);
  o->state = state;
  return o;
}

ObjPtr Unpickler::State::numpy_array(const Obj& state) {
  // (version 1, shape, dtype, is_fortran, data: bytes, or a list for object arrays)
  const std::vector<ObjPtr>& f = state.elements;
  if (state.kind != Obj::Kind::Tuple || f.size() != 5 || !is_leaf(*f[0], Value::Kind::Int) ||
      f[1]->kind != Obj::Kind::Tuple || f[2]->kind != Obj::Kind::NumpyDType || !is_leaf(*f[3], Value::Kind::Bool) ||
      !(is_leaf(*f[4], Value::Kind::Bytes) || f[4]->kind == Obj::Kind::List))
    fail("numpy.ndarray state is not (version, shape, dtype, is_fortran, data)");
  const Obj& dtype = *f[2];
  Shape shape;
  int64_t numel = 1;
  for (const ObjPtr& d : f[1]->elements) {
    if (!is_leaf(*d, Value::Kind::Int) || d->leaf.to_int() < 0) fail("numpy.ndarray: a dimension is not an int >= 0");
    shape.push_back(d->leaf.to_int());
    if (__builtin_mul_overflow(numel, shape.back(), &numel) || shape.size() > 64)
      fail(cat_str("numpy.ndarray: the shape ", shape, " overflows"));
  }
  std::optional<FileDType> type = numpy_numeric(dtype);
  bool bytes = is_leaf(*f[4], Value::Kind::Bytes);
  uint64_t nbytes = 0;
  if (bytes && dtype.np_itemsize > 0 &&
      __builtin_mul_overflow(static_cast<uint64_t>(numel), dtype.np_itemsize, &nbytes))
    fail(cat_str("numpy.ndarray: the shape ", shape, " overflows"));
  if (bytes && (dtype.np_itemsize == 0 || f[4]->leaf.to_string().size() != nbytes))
    fail(cat_str("numpy.ndarray of shape ", shape, " and dtype ", printable(numpy_dtype_text(dtype)), " holds ",
                 f[4]->leaf.to_string().size(), " bytes of data, not ", nbytes));
  const bool fortran = f[3]->leaf.to_bool();
  if (!bytes || !type) return numpy_raw("numpy.ndarray", numpy_dtype_text(dtype), &shape, fortran, f[4]);
  std::string data = f[4]->leaf.to_string();
  bool complex = *type == FileDType::Complex64 || *type == FileDType::Complex128;
  if (dtype.np_order == '>') byteswap(data, complex ? dtype.np_itemsize / 2 : dtype.np_itemsize);
  ObjPtr t = make(Obj::Kind::Tensor);
  t->storage = Storage::allocate(data.size());
  if (!data.empty()) std::memcpy(t->storage->data(), data.data(), data.size());
  t->dtype = *type;
  t->numel = static_cast<uint64_t>(numel);
  t->sizes = shape;
  t->strides.assign(shape.size(), 1);
  for (size_t i = 1; i < shape.size(); ++i) {  // row-major, or column-major for Fortran order
    size_t d = fortran ? i : shape.size() - 1 - i, prev = fortran ? i - 1 : d + 1;
    t->strides[d] = t->strides[prev] * std::max<int64_t>(shape[prev], 1);
  }
  t->np_dtype = numpy_dtype_text(dtype, true);
  return t;
}

ObjPtr Unpickler::State::numpy_scalar(const std::vector<ObjPtr>& args) {
  // scalar(dtype, data bytes)
  if (args.size() != 2 || args[0]->kind != Obj::Kind::NumpyDType || !is_leaf(*args[1], Value::Kind::Bytes))
    fail("numpy.core.multiarray.scalar takes (numpy.dtype, bytes); object scalars are not supported");
  const Obj& dtype = *args[0];
  std::string data = args[1]->leaf.to_string();
  if (dtype.np_itemsize == 0 || data.size() != dtype.np_itemsize)
    fail(cat_str("a NumPy scalar of dtype ", printable(numpy_dtype_text(dtype)), " holds ", data.size(), " bytes"));
  std::optional<FileDType> type = numpy_numeric(dtype);
  bool complex = type && (*type == FileDType::Complex64 || *type == FileDType::Complex128);
  if (type && dtype.np_order == '>') byteswap(data, complex ? data.size() / 2 : data.size());
  uint64_t u = 0;
  if (type && !complex) std::memcpy(&u, data.data(), std::min<size_t>(data.size(), 8));  // little-endian
  auto sign_extend = [&](int bits) { return static_cast<int64_t>(u << (64 - bits)) >> (64 - bits); };
  if (type) switch (*type) {
      case FileDType::Bool:
        return leaf(Value(u != 0));
      case FileDType::Int8:
      case FileDType::Int16:
      case FileDType::Int32:
      case FileDType::Int64:
        return leaf(Value(sign_extend(static_cast<int>(data.size() * 8))));
      case FileDType::UInt8:
      case FileDType::UInt16:
      case FileDType::UInt32:
        return leaf(Value(static_cast<int64_t>(u)));
      case FileDType::UInt64:
        if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return leaf(Value(static_cast<int64_t>(u)));
        break;
      case FileDType::Float16:
        return leaf(Value(static_cast<double>(half_bits_to_float(static_cast<uint16_t>(u)))));
      case FileDType::Float32: {
        float x;
        std::memcpy(&x, data.data(), 4);
        return leaf(Value(static_cast<double>(x)));
      }
      case FileDType::Float64: {
        double x;
        std::memcpy(&x, data.data(), 8);
        return leaf(Value(x));
      }
      default:
        break;
    }
  return numpy_raw("numpy.scalar", numpy_dtype_text(dtype, type.has_value()), nullptr, false,
                   leaf(Value::bytes(std::move(data))));
}

void Unpickler::State::build(Obj& target, const ObjPtr& state_ptr) {
  const Obj& state = *state_ptr;
  bool empty = is_leaf(state, Value::Kind::None) || (state.kind == Obj::Kind::Dict && state.items.empty());
  if (takes_items(target)) {
    if (target.state) fail(cat_str("BUILD of ", printable(target.global), " twice"));
    adopt(target, state_ptr);
    target.state = state_ptr;
  } else if (target.kind == Obj::Kind::NumpyDType) {
    numpy_dtype_state(target, state);
  } else if (target.kind == Obj::Kind::NumpyArray) {
    if (target.frozen) fail("BUILD of a numpy.ndarray already inside another object");
    target = std::move(*numpy_array(state));
  } else if (target.kind == Obj::Kind::Dict && target.ordered) {
    // An OrderedDict's attributes, e.g. a state_dict's _metadata (versions of its modules):
    // accepted and dropped, as they are not part of the mapping.
    if (!empty && state.kind != Obj::Kind::Dict) fail(cat_str("BUILD of an OrderedDict with a ", kind_name(state)));
  } else if (target.kind == Obj::Kind::Tensor) {
    if (!empty) fail("BUILD of a Tensor with attributes is not supported (they must be empty)");
  } else {
    fail(cat_str("BUILD of a ", kind_name(target), " is not allowed"));
  }
}

void Unpickler::State::run() {
  for (;;) {
    op_position = in->position();
    op = "end of input";
    if (in->remaining() == 0) fail("the pickle ends without STOP (truncated?)");
    uint8_t code;
    in->read(&code, 1);
    op = opcode_name(code);
    if (!op) {
      op = "?";
      throw Error(cat_str(where(), ": unknown opcode 0x", std::hex, int{code}, std::dec, " at byte ", op_position));
    }
    switch (code) {
      case 0x80: {  // PROTO
        uint64_t proto = read_uint(1);
        if (proto < 2 || proto > 5) fail(cat_str("pickle protocol ", proto, " is not supported (2 to 5 are)"));
        break;
      }
      case 0x95:
        need(read_uint(8));
        break;     // FRAME: a length hint, the opcodes follow as usual
      case '.': {  // STOP
        if (stack.size() != 1 || !marks.empty())
          fail(cat_str("STOP with ", stack.size(), " objects and ", marks.size(),
                       " marks on the stack (expected one object)"));
        result = pop();
        return;
      }
      case '(':
        if (marks.size() >= kMaxDepth) fail(cat_str("more than ", kMaxDepth, " open marks (nesting too deep)"));
        marks.push_back(stack.size());
        break;
      case '0':  // POP: as Python, an empty frame pops its mark
        if (stack.size() == frame_start() && !marks.empty())
          marks.pop_back();
        else
          pop();
        break;
      case '1':
        pop_mark();
        break;
      case 'N':
        push(leaf(Value()));
        break;
      case 0x88:
        push(leaf(Value(true)));
        break;
      case 0x89:
        push(leaf(Value(false)));
        break;
      case 'J':
        push(leaf(Value(static_cast<int64_t>(static_cast<int32_t>(read_uint(4))))));
        break;
      case 'K':
        push(leaf(Value(static_cast<int64_t>(read_uint(1)))));
        break;
      case 'M':
        push(leaf(Value(static_cast<int64_t>(read_uint(2)))));
        break;
      case 0x8a: {  // LONG1: n bytes of little-endian two's complement
        uint64_t n = read_uint(1);
        if (n > 8) fail(cat_str("an integer of ", n, " bytes is beyond 64 bits"));
        uint64_t v = read_uint(static_cast<size_t>(n));
        if (n > 0 && n < 8 && (v >> (8 * n - 1) & 1)) v |= ~uint64_t{0} << (8 * n);  // sign-extend
        push(leaf(Value(static_cast<int64_t>(v))));
        break;
      }
      case 'G': {  // BINFLOAT: big-endian double
        need(8);
        uint8_t b[8];
        in->read(b, 8);
        uint64_t bits = 0;
        for (uint8_t c : b) bits = bits << 8 | c;
        double d;
        std::memcpy(&d, &bits, 8);
        push(leaf(Value(d)));
        break;
      }
      case 'X':
        push(leaf(Value(read_string(read_uint(4)))));
        break;
      case 0x8c:
        push(leaf(Value(read_string(read_uint(1)))));
        break;
      case 0x8d:
        push(leaf(Value(read_string(read_uint(8)))));
        break;
      case 'U':
        push(leaf(Value(read_string(read_uint(1)))));
        break;
      case 'T': {
        auto n = static_cast<int32_t>(read_uint(4));
        if (n < 0) fail(cat_str("negative string length ", n));
        push(leaf(Value(read_string(static_cast<uint64_t>(n)))));
        break;
      }
      case 'B':
        push(leaf(Value::bytes(read_string(read_uint(4)))));
        break;
      case 'C':
        push(leaf(Value::bytes(read_string(read_uint(1)))));
        break;
      case 0x8e:
        push(leaf(Value::bytes(read_string(read_uint(8)))));
        break;
      case ']':
        push(make(Obj::Kind::List));
        break;
      case ')':
        push(make(Obj::Kind::Tuple));
        break;
      case '}':
        push(make(Obj::Kind::Dict));
        break;
      case 0x8f:
        push(make(Obj::Kind::Set));
        break;
      case 'a':
      case 'e': {  // APPEND, APPENDS
        std::vector<ObjPtr> items;
        if (code == 'a')
          items.push_back(pop());
        else
          items = pop_mark();
        Obj& list = *top();
        if (list.kind != Obj::Kind::List && !takes_items(list))
          fail(cat_str(op, " on a ", kind_name(list), " (only a list takes it)"));
        for (const ObjPtr& item : items) add_element(list, item);
        break;
      }
      case 's':
      case 'u': {  // SETITEM, SETITEMS
        std::vector<ObjPtr> items;
        if (code == 's') {
          ObjPtr value = pop();
          items = {pop(), value};
        } else {
          items = pop_mark();
          if (items.size() % 2 != 0)
            fail(cat_str("SETITEMS with an odd number (", items.size(), ") of keys and values"));
        }
        Obj& dict = *top();
        if (dict.kind != Obj::Kind::Dict && !takes_items(dict))
          fail(cat_str(op, " on a ", kind_name(dict), " (only a dict takes it)"));
        for (size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
        break;
      }
      case 0x90: {  // ADDITEMS
        std::vector<ObjPtr> items = pop_mark();
        Obj& set = *top();
        if (set.kind != Obj::Kind::Set) fail(cat_str("ADDITEMS on a ", kind_name(set), " (only a set takes it)"));
        for (const ObjPtr& item : items) add_element(set, item);
        break;
      }
      case 0x91:
        push(sequence(Obj::Kind::Set, pop_mark()));
        break;  // FROZENSET
      case 't':
        push(sequence(Obj::Kind::Tuple, pop_mark()));
        break;
      case 0x85:
      case 0x86:
      case 0x87: {  // TUPLE1..3
        std::vector<ObjPtr> items(code - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(sequence(Obj::Kind::Tuple, items));
        break;
      }
      case 'h':
        memo_get(read_uint(1));
        break;
      case 'j':
        memo_get(read_uint(4));
        break;
      case 'q':
        memo_put(read_uint(1));
        break;
      case 'r':
        memo_put(read_uint(4));
        break;
      case 0x94:
        memo_put(memo.size());
        break;
      case 'c': {
        std::string module = read_line();
        global(module, read_line());
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        ObjPtr name = pop(), module = pop();
        if (!is_leaf(*module, Value::Kind::String) || !is_leaf(*name, Value::Kind::String))
          fail("STACK_GLOBAL needs two str");
        global(module->leaf.to_string(), name->leaf.to_string());
        break;
      }
      case 'R': {
        ObjPtr args = pop(), callable = pop();
        reduce(*callable, *args);
        break;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args), here only OrderedDict()
        ObjPtr args = pop(), cls = pop();
        if (cls->kind == Obj::Kind::Global && cls->opaque) {
          opaque_object(*cls, OpaqueObject::Made::New, *args);
          break;
        }
        if (cls->kind != Obj::Kind::Global || cls->global != "collections.OrderedDict")
          fail(
              cat_str("NEWOBJ of ", cls->kind == Obj::Kind::Global ? cls->global : kind_name(*cls), " is not allowed"));
        reduce(*cls, *args);
        break;
      }
      case 'b': {
        ObjPtr state = pop();
        build(*top(), state);
        break;
      }
      case 'Q':
        persistent_id(*pop());
        break;
      default:
        throw Error(cat_str(where(), ": opcode ", op, " (0x", std::hex, int{code}, std::dec, ") at byte ", op_position,
                            " is not allowed"));
    }
  }
}

Unpickler::Unpickler(std::string file, std::string source, PersistentLoad persistent_load, bool opaque_objects)
    : state_(std::make_unique<State>()) {
  state_->file = std::move(file);
  state_->source = std::move(source);
  state_->persistent_load = std::move(persistent_load);
  state_->opaque = opaque_objects;
}

Unpickler::~Unpickler() = default;
Unpickler::Unpickler(Unpickler&&) noexcept = default;
Unpickler& Unpickler::operator=(Unpickler&&) noexcept = default;

void Unpickler::load(PickleInput& input) {
  state_->in = &input;
  state_->run();
  state_->in = nullptr;
  state_->stack.clear();
  state_->memo.clear();
}

// ---------------------------------------------------------------- Obj -> Value

namespace {

// Builds Values from the unpickled objects; an object reached twice (memo) gives one Value.
class Converter {
 public:
  Converter(const std::string& file, bool widen) : file_(file), widen_(widen) {}

  Value convert(const ObjPtr& o, const std::string& path) {
    auto it = done_.find(o.get());
    if (it != done_.end()) return it->second;
    Value v;
    switch (o->kind) {
      case Obj::Kind::Leaf:
        return o->leaf;
      case Obj::Kind::Tensor:
        // A NumPy array of a type tvc neither has nor was asked to widen (complex, unsigned
        // without widen): its raw data.
        if (!o->np_dtype.empty() && !exact_dtype(o->dtype) && !(widen_ && widened_dtype(o->dtype)))
          v = numpy_raw(*o);
        else
          v = Value(tensor(*o, path));
        break;
      case Obj::Kind::Object: {
        OpaqueObject x{o->global, o->made};
        for (size_t i = 0; i < o->args.size(); ++i) x.args.push_back(convert(o->args[i], child(path, "args")));
        if (o->state) x.state = convert(o->state, path);
        for (const ObjPtr& e : o->elements) x.appended.push_back(convert(e, child(path, "items")));
        for (const auto& [k, val] : o->items) x.set_items.emplace_back(convert(k, path), convert(val, path));
        v = Value::object(std::move(x));
        break;
      }
      case Obj::Kind::NumpyDType:
        v = Value::object({"numpy.dtype", OpaqueObject::Made::Call, {Value(numpy_dtype_text(*o))}});
        break;
      case Obj::Kind::List:
      case Obj::Kind::Tuple:
      case Obj::Kind::Set: {
        std::vector<Value> items;
        for (size_t i = 0; i < o->elements.size(); ++i)
          items.push_back(convert(o->elements[i], child(path, std::to_string(i))));
        v = o->kind == Obj::Kind::List    ? Value::list(std::move(items))
            : o->kind == Obj::Kind::Tuple ? Value::tuple(std::move(items))
                                          : Value::set(std::move(items));
        break;
      }
      case Obj::Kind::Dict: {
        Value::Items items;
        for (const auto& [k, val] : o->items) {
          Value key = convert(k, path);
          std::string name = key.kind() == Value::Kind::String ? key.to_string()
                             : key.kind() == Value::Kind::Int  ? std::to_string(key.to_int())
                                                               : std::string("<") + key.kind_name() + " key>";
          items.emplace_back(std::move(key), convert(val, child(path, name)));
        }
        v = Value::dict(std::move(items), o->ordered);
        break;
      }
      case Obj::Kind::Global:
        if (o->opaque) {
          v = Value::object({o->global, OpaqueObject::Made::Global});
          break;
        }
        [[fallthrough]];
      default:
        throw Error(cat_str("'", printable(file_), "': the checkpoint holds a ", kind_name(*o), " at '",
                            printable(path), "', which is not a value"));
    }
    done_.emplace(o.get(), v);
    return v;
  }

 private:
  static std::string child(const std::string& path, const std::string& name) {
    return path.empty() ? name : path + "." + name;
  }

  static Value numpy_raw(const Obj& t) {
    std::vector<Value> dims;
    for (int64_t d : t.sizes) dims.push_back(Value(d));
    std::string data(static_cast<const char*>(t.storage->data()), t.storage->nbytes());
    // numpy_array made the strides column-major exactly for Fortran order (of 2 or more dims).
    const bool fortran = t.sizes.size() > 1 && t.strides.front() == 1 && t.strides.back() != 1;
    Value::Items state{{Value("dtype"), Value(t.np_dtype)},
                       {Value("shape"), Value::tuple(std::move(dims))},
                       {Value("fortran_order"), Value(fortran)},
                       {Value("data"), Value::bytes(std::move(data))}};
    return Value::object({"numpy.ndarray", OpaqueObject::Made::New, {}, Value::dict(std::move(state))});
  }

  Tensor tensor(const Obj& t, const std::string& path) {
    std::optional<DType> dtype = exact_dtype(t.dtype);
    std::shared_ptr<Storage> storage = t.storage;
    if (!dtype) {
      std::optional<DType> wide = widened_dtype(t.dtype);
      TVC_CHECK(widen_ && wide, "'", printable(file_), "': tensor '", printable(path), "' has element type ",
                torch_storage_name(t.dtype), ", which tvc lacks",
                wide ? cat_str(" (ReadOptions::widen loads it as ", dtype_name(*wide), ")") : std::string());
      dtype = wide;
      storage = widened(t, *wide, path);
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->storage = storage;
    impl->shape = t.sizes;
    impl->strides = t.strides;
    impl->offset = t.offset;
    impl->dtype = *dtype;
    impl->requires_grad = t.requires_grad && is_floating(*dtype);
    return Tensor(impl);
  }

  // The storage of t converted element by element to dtype, once per storage.
  std::shared_ptr<Storage> widened(const Obj& t, DType dtype, const std::string& path) {
    auto it = widened_.find(t.storage.get());
    if (it != widened_.end()) return it->second;
    auto out = Storage::allocate(static_cast<size_t>(t.numel) * dtype_size(dtype));
    const auto* src = static_cast<const uint8_t*>(t.storage->data());
    size_t in_size = element_bytes(t.dtype);
    for (uint64_t i = 0; i < t.numel; ++i) {
      uint64_t u = 0;
      std::memcpy(&u, src + i * in_size, in_size);  // little-endian file and host
      switch (dtype) {
        case DType::Int32:
          static_cast<int32_t*>(out->data())[i] = static_cast<int32_t>(u);
          break;
        case DType::Int64:
          TVC_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), "'", printable(file_),
                    "': tensor '", printable(path), "' holds the unsigned value ", u, ", beyond int64");
          static_cast<int64_t*>(out->data())[i] = static_cast<int64_t>(u);
          break;
        case DType::Float32:
          static_cast<float*>(out->data())[i] = decode_small_float(t.dtype, static_cast<uint8_t>(u));
          break;
        default:
          throw Error(
              cat_str("'", printable(file_), "': cannot widen tensor '", printable(path), "' to ", dtype_name(dtype)));
      }
    }
    widened_.emplace(t.storage.get(), out);
    return out;
  }

  const std::string& file_;
  bool widen_;
  std::unordered_map<const Obj*, Value> done_;
  std::unordered_map<const Storage*, std::shared_ptr<Storage>> widened_;
};

}  // namespace

Value Unpickler::value(bool widen) const {
  TVC_CHECK(state_->result != nullptr, "Unpickler::value: nothing loaded");
  return Converter(state_->file, widen).convert(state_->result, "");
}

// ---------------------------------------------------------------- pickler

namespace {

class Pickler {
 public:
  explicit Pickler(std::vector<PickledStorage>& storages) : storages_(storages) {}

  std::string run(const Value& value) {
    collect(value, 0);
    finish_ranges();
    op(0x80);
    op(2);  // PROTO 2
    save(value, 0);
    op('.');
    return std::move(out_);
  }

 private:
  void op(uint8_t code) { out_ += static_cast<char>(code); }
  void put_uint(uint64_t v, size_t n) {
    for (size_t i = 0; i < n; ++i) out_ += static_cast<char>(v >> (8 * i) & 0xff);
  }
  void global(const char* module, const std::string& name) {
    op('c');
    out_ += module;
    out_ += '\n';
    out_ += name;
    out_ += '\n';
  }
  void save_int(int64_t v) {  // as Python's save_long
    if (v >= 0 && v <= 0xff) {
      op('K');
      put_uint(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v <= 0xffff) {
      op('M');
      put_uint(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      put_uint(static_cast<uint32_t>(v), 4);
    } else {  // LONG1: the shortest little-endian two's complement
      auto u = static_cast<uint64_t>(v);
      size_t n = 8;
      while (n > 1) {
        uint8_t last = u >> (8 * (n - 1)) & 0xff, prev_sign = u >> (8 * (n - 2) + 7) & 1;
        if ((last == 0 && !prev_sign) || (last == 0xff && prev_sign))
          --n;
        else
          break;
      }
      op(0x8a);
      put_uint(n, 1);
      put_uint(u, n);
    }
  }
  void save_str(const std::string& s) {
    TVC_CHECK(s.size() <= UINT32_MAX, "save_pth: a string of ", s.size(), " bytes is too long for pickle protocol 2");
    op('X');
    put_uint(s.size(), 4);
    out_ += s;
  }
  // Tuples as Python writes them: EMPTY_TUPLE, TUPLE1-3 after the items, else MARK ... TUPLE.
  template <typename SaveItem>
  void save_tuple(size_t n, SaveItem save_item) {
    if (n == 0) return op(')');
    if (n > 3) op('(');
    for (size_t i = 0; i < n; ++i) save_item(i);
    op(n > 3 ? 't' : static_cast<uint8_t>(0x84 + n));
  }
  void save_shape(const Shape& dims) {
    save_tuple(dims.size(), [&](size_t i) { save_int(dims[i]); });
  }
  void empty_ordered_dict() {
    global("collections", "OrderedDict");
    op(')');
    op('R');
  }

  void save(const Value& v, size_t depth) {  // depth was checked by collect()
    switch (v.kind()) {
      case Value::Kind::None:
        op('N');
        break;
      case Value::Kind::Bool:
        op(v.to_bool() ? 0x88 : 0x89);
        break;
      case Value::Kind::Int:
        save_int(v.to_int());
        break;
      case Value::Kind::Float: {
        double d = v.to_float();
        uint64_t bits;
        std::memcpy(&bits, &d, 8);
        op('G');
        for (int i = 7; i >= 0; --i) out_ += static_cast<char>(bits >> (8 * i) & 0xff);
        break;
      }
      case Value::Kind::String:
        save_str(v.to_string());
        break;
      case Value::Kind::Bytes: {
        // Protocol 2 has no bytes opcode: _codecs.encode(<bytes as a latin-1 str>, 'latin1').
        std::string utf8;
        for (char c : v.to_string()) {
          auto b = static_cast<uint8_t>(c);
          if (b < 0x80) {
            utf8 += c;
          } else {
            utf8 += static_cast<char>(0xc0 | b >> 6);
            utf8 += static_cast<char>(0x80 | (b & 0x3f));
          }
        }
        global("_codecs", "encode");
        save_str(utf8);
        save_str("latin1");
        op(0x86);
        op('R');
        break;
      }
      case Value::Kind::Tensor:
        save_tensor(v.to_tensor());
        break;
      case Value::Kind::List: {
        op(']');
        batches(v.elements().size(), 'a', 'e', [&](size_t i) { save(v.elements()[i], depth + 1); });
        break;
      }
      case Value::Kind::Tuple:
        save_tuple(v.elements().size(), [&](size_t i) { save(v.elements()[i], depth + 1); });
        break;
      case Value::Kind::Set: {  // set([items]), as protocol 2 writes it
        global("__builtin__", "set");
        op(']');
        batches(v.elements().size(), 'a', 'e', [&](size_t i) { save(v.elements()[i], depth + 1); });
        op(0x85);
        op('R');
        break;
      }
      case Value::Kind::Dict: {
        if (v.ordered())
          empty_ordered_dict();
        else
          op('}');
        const Value::Items& items = v.items();
        batches(items.size(), 's', 'u', [&](size_t i) {
          save(items[i].first, depth + 1);
          save(items[i].second, depth + 1);
        });
        break;
      }
      case Value::Kind::Object:  // refused by collect()
        break;
    }
  }

  // Python's _batch_appends/_batch_setitems: batches of 1000, a lone item without MARK.
  template <typename SaveItem>
  void batches(size_t n, uint8_t one, uint8_t many, SaveItem save_item) {
    for (size_t start = 0; start < n; start += 1000) {
      size_t end = std::min(n, start + 1000);
      if (end - start > 1) op('(');
      for (size_t i = start; i < end; ++i) save_item(i);
      op(end - start > 1 ? many : one);
    }
  }

  // A saved storage is a tvc Storage seen as one dtype, cut to the elements its tensors use.
  using StorageKey = std::pair<const Storage*, DType>;
  struct Range {
    size_t index = 0;                                          // into storages_
    int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;  // elements [lo, hi) used
  };

  // First pass: which storages the tensors use, and which elements of each.
  void collect(const Value& v, size_t depth) {
    TVC_CHECK(depth <= kMaxDepth, "save_pth: the value nests deeper than ", kMaxDepth, " levels");
    switch (v.kind()) {
      case Value::Kind::Tensor: {
        const Tensor& t = v.to_tensor();
        TVC_CHECK(t.device() == Device::CPU, "save_pth: a tensor is on ", device_name(t.device()),
                  "; move it to the CPU first");
        auto [it, added] = ranges_.emplace(StorageKey{t.storage().get(), t.dtype()}, Range{});
        if (added) {
          it->second.index = storages_.size();
          storages_.push_back({std::to_string(storages_.size()), t.storage(), file_dtype(t.dtype()), 0, 0});
        }
        if (t.numel() == 0) break;
        int64_t last = t.storage_offset();
        for (int64_t d = 0; d < t.dim(); ++d) last += (t.shape()[d] - 1) * t.strides()[d];
        TVC_CHECK(t.storage_offset() >= 0 && (last + 1) * static_cast<int64_t>(t.element_size()) <=
                                                 static_cast<int64_t>(t.storage()->nbytes()),
                  "save_pth: a tensor of size ", t.shape(), " reaches past the end of its storage");
        it->second.lo = std::min(it->second.lo, t.storage_offset());
        it->second.hi = std::max(it->second.hi, last + 1);
        break;
      }
      case Value::Kind::List:
      case Value::Kind::Tuple:
      case Value::Kind::Set:
        for (const Value& e : v.elements()) collect(e, depth + 1);
        break;
      case Value::Kind::Dict:
        for (const auto& [k, e] : v.items()) {
          collect(k, depth + 1);
          collect(e, depth + 1);
        }
        break;
      case Value::Kind::Object:
        throw Error(cat_str("save_pth: the value holds an opaque object (", printable(v.object().global),
                            "), which tvc writes no pickle for; keep only the weights (load_state_dict with unwrap)"));
      default:
        break;
    }
  }

  void finish_ranges() {
    for (auto& [key, range] : ranges_) {
      if (range.hi == 0) range.lo = 0;  // only empty tensors
      PickledStorage& s = storages_[range.index];
      s.numel = static_cast<uint64_t>(range.hi - range.lo);
      s.byte_offset = static_cast<uint64_t>(range.lo) * static_cast<uint64_t>(bit_size(s.dtype) / 8);
    }
  }

  void save_tensor(const Tensor& t) {
    const Range& range = ranges_.at(StorageKey{t.storage().get(), t.dtype()});
    const PickledStorage& saved = storages_[range.index];
    // Offsets relative to the saved range; an empty tensor's only has to lie within it.
    int64_t offset = t.storage_offset() - range.lo;
    if (t.numel() == 0) offset = std::clamp<int64_t>(offset, 0, static_cast<int64_t>(saved.numel));
    global("torch._utils", "_rebuild_tensor_v2");
    op('(');
    // The persistent id ('storage', torch.<X>Storage, key, 'cpu', numel).
    op('(');
    save_str("storage");
    global("torch", torch_storage_name(saved.dtype));
    save_str(saved.key);
    save_str("cpu");
    save_int(static_cast<int64_t>(saved.numel));
    op('t');
    op('Q');
    save_int(offset);
    save_shape(t.shape());
    save_shape(t.strides());
    op(t.requires_grad() ? 0x88 : 0x89);
    empty_ordered_dict();  // backward hooks
    op('t');
    op('R');
  }

  std::vector<PickledStorage>& storages_;
  std::map<StorageKey, Range> ranges_;
  std::string out_;
};

}  // namespace

std::string pickle_value(const Value& value, std::vector<PickledStorage>& storages) {
  storages.clear();
  return Pickler(storages).run(value);
}

}  // namespace tvc::io
