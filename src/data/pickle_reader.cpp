#include "hpc_train/data/pickle_reader.h"

#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_map>

#include "hpc_train/error.h"
#include "hpc_train/io/byte_order.h"

namespace hpc_train {
namespace {

using Kind = PickleValue::Kind;

// The callables a REDUCE may call; anything else is refused when its GLOBAL is read.
enum class Callable : int64_t { kReconstruct, kNdarray, kDtype, kFromBuffer, kCodecsEncode };

struct KnownGlobal {
  const char* module;
  const char* name;
  Callable callable;
};
const KnownGlobal kKnownGlobals[] = {
    {"numpy.core.multiarray", "_reconstruct", Callable::kReconstruct},
    {"numpy._core.multiarray", "_reconstruct", Callable::kReconstruct},
    {"numpy", "ndarray", Callable::kNdarray},
    {"numpy", "dtype", Callable::kDtype},
    {"numpy.core.numeric", "_frombuffer", Callable::kFromBuffer},
    {"numpy._core.numeric", "_frombuffer", Callable::kFromBuffer},
    {"_codecs", "encode", Callable::kCodecsEncode},
};

// Python's opcodes (Lib/pickletools.py), those this reader handles.
enum Opcode : uint8_t {
  kMark = '(', kStop = '.', kBinInt = 'J', kBinInt1 = 'K', kBinInt2 = 'M', kNone = 'N',
  kReduce = 'R', kBinString = 'T', kShortBinString = 'U', kBinUnicode = 'X', kAppend = 'a',
  kBuild = 'b', kGlobal = 'c', kDict = 'd', kEmptyDict = '}', kAppends = 'e', kBinGet = 'h',
  kLongBinGet = 'j', kList = 'l', kEmptyList = ']', kBinPut = 'q', kLongBinPut = 'r',
  kSetItem = 's', kTuple = 't', kEmptyTuple = ')', kSetItems = 'u', kProto = 0x80,
  kTuple1 = 0x85, kTuple2 = 0x86, kTuple3 = 0x87, kNewTrue = 0x88, kNewFalse = 0x89,
  kLong1 = 0x8a, kBinBytes = 'B', kShortBinBytes = 'C', kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d, kBinBytes8 = 0x8e, kStackGlobal = 0x93, kMemoize = 0x94, kFrame = 0x95,
  kByteArray8 = 0x96,
};
constexpr int kHighestProtocol = 5;

class Parser {
 public:
  Parser(const std::string& where, const uint8_t* data, size_t size)
      : where_(where + ": "), data_(data), size_(size) {}

  Pickle parse() {
    while (true) {
      op_at_ = at_;
      const uint8_t op = u8();
      switch (op) {
        case kProto: {
          const int protocol = u8();
          if (protocol > kHighestProtocol)
            fail("pickle protocol " + std::to_string(protocol) + ", this reader knows 2 to 5");
          break;
        }
        case kFrame: take(8); break;  // framing only groups the opcodes that follow
        case kMark: marks_.push_back(stack_.size()); break;
        case kStop: {
          pickle_.root = pop();
          return std::move(pickle_);
        }
        case kNone: push(make(Kind::kNone)); break;
        case kNewTrue: case kNewFalse: {
          PickleValue* value = make(Kind::kBool);
          value->integer = op == kNewTrue;
          push(value);
          break;
        }
        case kBinInt: push_int(static_cast<int32_t>(le(4))); break;
        case kBinInt1: push_int(static_cast<int64_t>(le(1))); break;
        case kBinInt2: push_int(static_cast<int64_t>(le(2))); break;
        case kLong1: {
          const uint64_t count = le(1);
          if (count > 8) fail("an integer of " + std::to_string(count) + " bytes, over 64 bits");
          push_int(load_little_endian_signed(take(count), static_cast<size_t>(count)));
          break;
        }
        case kBinString: {
          const int32_t length = static_cast<int32_t>(le(4));
          if (length < 0) fail("a BINSTRING of negative length " + std::to_string(length));
          push_string(Kind::kBytes, static_cast<uint64_t>(length));
          break;
        }
        case kShortBinString: case kShortBinBytes: push_string(Kind::kBytes, le(1)); break;
        case kBinBytes: push_string(Kind::kBytes, le(4)); break;
        case kBinBytes8: case kByteArray8: push_string(Kind::kBytes, le(8)); break;
        case kShortBinUnicode: push_string(Kind::kText, le(1)); break;
        case kBinUnicode: push_string(Kind::kText, le(4)); break;
        case kBinUnicode8: push_string(Kind::kText, le(8)); break;
        case kEmptyDict: push(make(Kind::kDict)); break;
        case kEmptyList: push(make(Kind::kList)); break;
        case kEmptyTuple: push(make(Kind::kTuple)); break;
        case kDict: case kList: case kTuple: {
          std::vector<const PickleValue*> items = pop_to_mark();
          const Kind kind = op == kDict ? Kind::kDict : op == kList ? Kind::kList : Kind::kTuple;
          if (kind == Kind::kDict && items.size() % 2 != 0) fail("a DICT of an odd item count");
          PickleValue* value = make(kind);
          value->items = std::move(items);
          push(value);
          break;
        }
        case kTuple1: case kTuple2: case kTuple3: {
          const size_t count = static_cast<size_t>(op - kTuple1 + 1);
          if (stack_.size() < count + stack_floor()) fail("a TUPLE" + std::to_string(count) +
                                                          " with too few values on the stack");
          PickleValue* value = make(Kind::kTuple);
          value->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end());
          stack_.resize(stack_.size() - count);
          push(value);
          break;
        }
        case kAppend: {
          const PickleValue* item = pop();
          container(Kind::kList, "APPEND")->items.push_back(item);
          break;
        }
        case kAppends: {
          std::vector<const PickleValue*> items = pop_to_mark();
          PickleValue* list = container(Kind::kList, "APPENDS");
          list->items.insert(list->items.end(), items.begin(), items.end());
          break;
        }
        case kSetItem: {
          const PickleValue* value = pop();
          const PickleValue* key = pop();
          PickleValue* dict = container(Kind::kDict, "SETITEM");
          dict->items.push_back(key);
          dict->items.push_back(value);
          break;
        }
        case kSetItems: {
          std::vector<const PickleValue*> items = pop_to_mark();
          if (items.size() % 2 != 0) fail("a SETITEMS of an odd item count");
          PickleValue* dict = container(Kind::kDict, "SETITEMS");
          dict->items.insert(dict->items.end(), items.begin(), items.end());
          break;
        }
        case kBinPut: memo_put(le(1)); break;
        case kLongBinPut: memo_put(le(4)); break;
        case kMemoize: memo_put(memo_.size()); break;
        case kBinGet: memo_get(le(1)); break;
        case kLongBinGet: memo_get(le(4)); break;
        case kGlobal: {
          const std::string module = line();
          const std::string name = line();
          push_global(module, name);
          break;
        }
        case kStackGlobal: {
          const PickleValue* name = pop();
          const PickleValue* module = pop();
          if (module->kind != Kind::kText || name->kind != Kind::kText)
            fail("a STACK_GLOBAL whose module and name are not strings");
          push_global(module->bytes, name->bytes);
          break;
        }
        case kReduce: {
          const PickleValue* args = pop();
          const PickleValue* callable = pop();
          if (callable->kind != Kind::kGlobal) fail("a REDUCE of a " + kind_of(callable));
          if (args->kind != Kind::kTuple) fail("a REDUCE whose arguments are not a tuple");
          push(reduce(static_cast<Callable>(callable->integer), callable->bytes, args->items));
          break;
        }
        case kBuild: {
          const PickleValue* state = pop();
          build(top(), state);
          break;
        }
        default: {
          char text[64];
          std::snprintf(text, sizeof text, "pickle opcode 0x%02x", op);
          std::string name = text;
          if (op >= 0x20 && op < 0x7f) name += std::string(" ('") + static_cast<char>(op) + "')";
          fail(name + " is not one this reader handles (it reads numpy arrays, dicts, lists, "
               "strings and ints only)");
        }
      }
    }
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw DataError(where_ + why + " (at byte " + std::to_string(op_at_) + ")");
  }
  static std::string kind_of(const PickleValue* value) { return pickle_kind_name(value->kind); }

  const uint8_t* take(uint64_t count) {
    if (count > size_ - at_) fail("truncated pickle: " + std::to_string(count) +
                                  " bytes needed, " + std::to_string(size_ - at_) + " left");
    const uint8_t* p = data_ + at_;
    at_ += static_cast<size_t>(count);
    return p;
  }
  uint8_t u8() { return *take(1); }
  uint64_t le(int count) {
    return load_little_endian(take(static_cast<uint64_t>(count)), static_cast<size_t>(count));
  }
  std::string line() {
    const void* end = std::memchr(data_ + at_, '\n', size_ - at_);
    if (!end) fail("truncated pickle: a GLOBAL without its newline");
    const size_t length = static_cast<size_t>(static_cast<const uint8_t*>(end) - (data_ + at_));
    std::string text(reinterpret_cast<const char*>(take(length)), length);
    take(1);
    return text;
  }

  PickleValue* make(Kind kind) {
    pickle_.values.emplace_back();
    pickle_.values.back().kind = kind;
    return &pickle_.values.back();
  }
  void push(PickleValue* value) { stack_.push_back(value); }
  void push_int(int64_t integer) {
    PickleValue* value = make(Kind::kInt);
    value->integer = integer;
    push(value);
  }
  void push_string(Kind kind, uint64_t length) {
    const uint8_t* p = take(length);
    PickleValue* value = make(kind);
    value->bytes.assign(reinterpret_cast<const char*>(p), static_cast<size_t>(length));
    push(value);
  }
  size_t stack_floor() const { return marks_.empty() ? 0 : marks_.back(); }
  PickleValue* top() {
    if (stack_.size() <= stack_floor()) fail("an opcode that needs a value on an empty stack");
    return stack_.back();
  }
  PickleValue* pop() {
    PickleValue* value = top();
    stack_.pop_back();
    return value;
  }
  std::vector<const PickleValue*> pop_to_mark() {
    if (marks_.empty()) fail("an opcode that needs a MARK without one");
    const size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<const PickleValue*> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark),
                                          stack_.end());
    stack_.resize(mark);
    return items;
  }
  PickleValue* container(Kind kind, const char* opcode) {
    PickleValue* value = top();
    if (value->kind != kind)
      fail(std::string(opcode) + " into a " + kind_of(value) + ", not a " +
           pickle_kind_name(kind));
    return value;
  }
  void memo_put(uint64_t index) { memo_[index] = top(); }
  void memo_get(uint64_t index) {
    const auto found = memo_.find(index);
    if (found == memo_.end()) fail("a memo index " + std::to_string(index) + " never stored");
    push(found->second);
  }
  void push_global(const std::string& module, const std::string& name) {
    for (const KnownGlobal& known : kKnownGlobals) {
      if (module == known.module && name == known.name) {
        PickleValue* value = make(Kind::kGlobal);
        value->bytes = module + "." + name;
        value->integer = static_cast<int64_t>(known.callable);
        push(value);
        return;
      }
    }
    fail("pickle global " + module + "." + name +
         " is not one this reader allows (only numpy's array reconstruction and _codecs.encode)");
  }

  // The bytes of a str encoded as Latin-1 (how both numpy and _codecs.encode see them).
  std::string latin1(const std::string& text) {
    std::string bytes;
    bytes.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      const uint8_t c = static_cast<uint8_t>(text[i]);
      if (c < 0x80) {
        bytes += static_cast<char>(c);
        ++i;
      } else if ((c & 0xe0) == 0xc0 && i + 1 < text.size() &&
                 (static_cast<uint8_t>(text[i + 1]) & 0xc0) == 0x80 && c <= 0xc3 && c >= 0xc2) {
        bytes += static_cast<char>(((c & 0x1f) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3f));
        i += 2;
      } else {
        fail("a str with a character outside Latin-1 (or invalid UTF-8) where bytes were meant");
      }
    }
    return bytes;
  }

  const PickleValue* arg(const std::vector<const PickleValue*>& args, size_t i,
                         const std::string& callable) {
    if (i >= args.size())
      fail(callable + "() called with " + std::to_string(args.size()) + " arguments");
    return args[i];
  }

  PickleValue* reduce(Callable callable, const std::string& name,
                      const std::vector<const PickleValue*>& args) {
    switch (callable) {
      case Callable::kReconstruct: {
        const PickleValue* type = arg(args, 0, name);
        if (type->kind != Kind::kGlobal || static_cast<Callable>(type->integer) != Callable::kNdarray)
          fail(name + "() of something other than numpy.ndarray");
        return make(Kind::kArray);  // empty until BUILD gives its state
      }
      case Callable::kDtype: {
        const PickleValue* dtype_name = arg(args, 0, name);
        if (!dtype_name->is_string()) fail("numpy.dtype() of a " + kind_of(dtype_name));
        PickleValue* dtype = make(Kind::kDtype);
        dtype->bytes = "=" + dtype_name->bytes;  // native order until BUILD says otherwise
        return dtype;
      }
      case Callable::kCodecsEncode: {
        const PickleValue* text = arg(args, 0, name);
        const PickleValue* encoding = arg(args, 1, name);
        if (text->kind != Kind::kText || encoding->kind != Kind::kText ||
            (encoding->bytes != "latin1" && encoding->bytes != "latin-1"))
          fail("_codecs.encode() other than of a str to 'latin1'");
        PickleValue* bytes = make(Kind::kBytes);
        bytes->bytes = latin1(text->bytes);
        return bytes;
      }
      case Callable::kFromBuffer: {  // protocol 5: _frombuffer(buffer, dtype, shape, order)
        const PickleValue* buffer = arg(args, 0, name);
        const PickleValue* order = arg(args, 3, name);
        if (order->kind != Kind::kText || order->bytes != "C")
          fail(name + "() of an array not in C order");
        PickleValue* array = make(Kind::kArray);
        fill_array(array, arg(args, 2, name), arg(args, 1, name), buffer);
        return array;
      }
      case Callable::kNdarray: break;
    }
    fail(name + "() called; this reader calls only numpy's array reconstruction");
  }

  // Shape, dtype and raw bytes of an array, checked against each other.
  void fill_array(PickleValue* array, const PickleValue* shape, const PickleValue* dtype,
                  const PickleValue* data) {
    if (shape->kind != Kind::kTuple) fail("an array shape that is not a tuple");
    if (dtype->kind != Kind::kDtype) fail("an array dtype that is not a numpy.dtype");
    const std::string& descr = dtype->bytes;  // e.g. "|u1"
    uint64_t item_bytes = 0;
    for (size_t i = 2; i < descr.size(); ++i) {
      if (descr[i] < '0' || descr[i] > '9' || item_bytes > 1'000'000)
        fail("an array of dtype '" + descr.substr(1) + "', not a plain numeric one");
      item_bytes = item_bytes * 10 + static_cast<uint64_t>(descr[i] - '0');
    }
    if (item_bytes == 0) fail("an array of dtype '" + descr.substr(1) + "', not a plain numeric one");
    uint64_t expected_bytes = item_bytes;
    bool too_large = false;
    array->shape.clear();
    for (const PickleValue* dim : shape->items) {
      if (dim->kind != Kind::kInt || dim->integer < 0) fail("an array shape entry that is not a size");
      array->shape.push_back(dim->integer);
      too_large |= __builtin_mul_overflow(expected_bytes, static_cast<uint64_t>(dim->integer),
                                          &expected_bytes);
    }
    if (too_large) fail("an array shape of over 2^64 bytes");
    std::string raw;
    if (data->kind == Kind::kBytes) raw = data->bytes;
    else if (data->kind == Kind::kText) raw = latin1(data->bytes);
    else fail("array data that is a " + kind_of(data) + ", not bytes (an object array?)");
    if (raw.size() != expected_bytes)
      fail("an array of " + std::to_string(raw.size()) + " data bytes where its shape and dtype '" +
           descr.substr(1) + "' need " + std::to_string(expected_bytes));
    array->dtype = descr;
    array->array_data = std::move(raw);
  }

  void build(PickleValue* object, const PickleValue* state) {
    if (state->kind != Kind::kTuple) fail("a BUILD whose state is not a tuple");
    const std::vector<const PickleValue*>& items = state->items;
    if (object->kind == Kind::kDtype) {
      // (version, byte order, subarray, names, fields, item size, alignment, flags)
      if (items.size() < 2 || (items[1]->kind != Kind::kText && items[1]->kind != Kind::kBytes) ||
          items[1]->bytes.size() != 1 ||
          std::string("<>|=").find(items[1]->bytes[0]) == std::string::npos)
        fail("a numpy.dtype state without its byte order");
      for (size_t i = 2; i < items.size() && i < 5; ++i)
        if (items[i]->kind != Kind::kNone) fail("a structured or subarray numpy.dtype");
      object->bytes[0] = items[1]->bytes[0];
      return;
    }
    if (object->kind != Kind::kArray) fail("a BUILD of a " + kind_of(object));
    // (version, shape, dtype, is_fortran, raw data), version 1; older numpy left out the version.
    const size_t first = items.size() == 5 ? 1 : 0;
    if (items.size() != 5 && items.size() != 4) fail("a numpy array state of " +
                                                     std::to_string(items.size()) + " items");
    const PickleValue* fortran = items[first + 2];
    if ((fortran->kind != Kind::kBool && fortran->kind != Kind::kInt) || fortran->integer != 0)
      fail("a Fortran-ordered numpy array");
    fill_array(object, items[first], items[first + 1], items[first + 3]);
  }

  std::string where_;
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
  size_t op_at_ = 0;
  Pickle pickle_;
  std::vector<PickleValue*> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, PickleValue*> memo_;
};

}  // namespace

const char* pickle_kind_name(PickleValue::Kind kind) {
  switch (kind) {
    case Kind::kNone: return "None";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kBytes: return "bytes";
    case Kind::kText: return "str";
    case Kind::kList: return "list";
    case Kind::kTuple: return "tuple";
    case Kind::kDict: return "dict";
    case Kind::kGlobal: return "global";
    case Kind::kDtype: return "numpy.dtype";
    case Kind::kArray: return "numpy array";
  }
  return "?";
}

const PickleValue* PickleValue::find(const std::string& key) const {
  if (kind != Kind::kDict) return nullptr;
  for (size_t i = 0; i + 1 < items.size(); i += 2)
    if (items[i]->is_string() && items[i]->bytes == key) return items[i + 1];
  return nullptr;
}

Pickle parse_pickle(const std::string& where, const uint8_t* data, size_t size) {
  return Parser(where, data, size).parse();
}

}  // namespace hpc_train
