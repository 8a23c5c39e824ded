// torchscript_file: zip archives written here, record by record (stored, "deflated" in name
// only, zip64, with a comment), read back entry by entry; a TorchScript archive's version
// record (.data/version preferred), code and data found; the content identity follows the
// records' contents and nothing else (not the top folder, the order or the compression); every
// kind of file that is no such archive is a DataError naming the file. tests/test_torchscript.sh
// reads the files PyTorch itself writes.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "hpc_train/error.h"
#include "hpc_train/model/torchscript_file.h"
#include "expect_error.h"

using namespace hpc_train;
namespace fs = std::filesystem;

namespace {

struct Record {
  std::string name;
  std::string data;
  uint16_t method = 0;  // only recorded: 8 claims deflate, the bytes stay as given
};

void put16(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 2; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put32(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put(std::vector<uint8_t>& out, const std::string& s) { out.insert(out.end(), s.begin(), s.end()); }

uint32_t crc_of(const std::string& data) {
  return static_cast<uint32_t>(
      crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
}

// A zip archive of `records` (APPNOTE.TXT); `zip64`: the end records and every entry's local
// header offset in their zip64 forms, as writers do for archives over 4 GiB.
std::vector<uint8_t> make_zip(const std::vector<Record>& records, bool zip64 = false,
                              const std::string& comment = "") {
  std::vector<uint8_t> out, directory;
  for (const Record& r : records) {
    const uint64_t offset = out.size();
    put32(out, 0x04034b50); put16(out, 20); put16(out, 0); put16(out, r.method);
    put16(out, 0); put16(out, 0); put32(out, crc_of(r.data));
    put32(out, r.data.size()); put32(out, r.data.size());
    put16(out, r.name.size()); put16(out, 0); put(out, r.name); put(out, r.data);

    put32(directory, 0x02014b50); put16(directory, 45); put16(directory, 20);
    put16(directory, 0); put16(directory, r.method); put16(directory, 0); put16(directory, 0);
    put32(directory, crc_of(r.data)); put32(directory, r.data.size());
    put32(directory, r.data.size()); put16(directory, r.name.size());
    put16(directory, zip64 ? 12 : 0); put16(directory, 0); put16(directory, 0);
    put16(directory, 0); put32(directory, 0); put32(directory, zip64 ? 0xffffffff : offset);
    put(directory, r.name);
    if (zip64) {
      put16(directory, 0x0001); put16(directory, 8); put64(directory, offset);
    }
  }
  const uint64_t directory_offset = out.size();
  out.insert(out.end(), directory.begin(), directory.end());
  if (zip64) {
    const uint64_t record_offset = out.size();
    put32(out, 0x06064b50); put64(out, 44); put16(out, 45); put16(out, 45); put32(out, 0);
    put32(out, 0); put64(out, records.size()); put64(out, records.size());
    put64(out, directory.size()); put64(out, directory_offset);
    put32(out, 0x07064b50); put32(out, 0); put64(out, record_offset); put32(out, 1);
  }
  put32(out, 0x06054b50); put16(out, 0); put16(out, 0);
  put16(out, zip64 ? 0xffff : records.size()); put16(out, zip64 ? 0xffff : records.size());
  put32(out, zip64 ? 0xffffffff : directory.size());
  put32(out, zip64 ? 0xffffffff : directory_offset);
  put16(out, comment.size()); put(out, comment);
  return out;
}

// A TorchScript-like archive under the top folder `top`.
std::vector<Record> module_records(const std::string& top, const std::string& weights = "w0w1") {
  return {{top + "/data/0", weights},
          {top + "/data.pkl", "pickled module"},
          {top + "/code/__torch__.py", "def forward(self, x): ...", 8},
          {top + "/code/__torch__.py.debug_pkl", "source ranges", 8},
          {top + "/constants.pkl", "()"},
          {top + "/version", "3\n"}};
}

class TorchScriptFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "hpc_train_torchscript_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) const {
    const std::string path = (fs::path(dir_) / name).string();
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return path;
  }

  // The DataError's message for `path` (fails the test when there is none or it misses `path`).
  std::string refusal(const std::string& path) const {
    return ::test_support::data_error_naming(path, [&] { read_torchscript_file_info(path); });
  }

  std::string dir_;
};

TEST_F(TorchScriptFileTest, ReadsTheCentralDirectoryAndStoredEntries) {
  const std::vector<Record> records = module_records("net");
  for (const bool zip64 : {false, true}) {
    const std::string path = write(zip64 ? "zip64.pt" : "plain.pt", make_zip(records, zip64, "a comment"));
    const std::vector<ZipEntry> entries = read_zip_directory(path);
    ASSERT_EQ(entries.size(), records.size()) << "zip64 " << zip64;
    uint64_t offset = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      EXPECT_EQ(entries[i].name, records[i].name);
      EXPECT_EQ(entries[i].method, records[i].method);
      EXPECT_EQ(entries[i].crc32, crc_of(records[i].data));
      EXPECT_EQ(entries[i].uncompressed_bytes, records[i].data.size());
      EXPECT_EQ(entries[i].local_header_offset, offset);
      offset += 30 + records[i].name.size() + records[i].data.size();
      if (records[i].method == 0) {
        const std::vector<uint8_t> data = read_zip_member(path, entries[i], 1 << 20);
        EXPECT_EQ(std::string(data.begin(), data.end()), records[i].data);
      } else {
        EXPECT_THROW(read_zip_member(path, entries[i], 1 << 20), DataError);
      }
    }
    EXPECT_THROW(read_zip_member(path, entries[0], 3), DataError);  // over max_bytes
  }
}

TEST_F(TorchScriptFileTest, FindsVersionCodeAndData) {
  const TorchScriptFileInfo info = read_torchscript_file_info(write("net.pt", make_zip(module_records("net"))));
  EXPECT_EQ(info.format_version, 3);
  EXPECT_EQ(info.version_record, "net/version");
  EXPECT_TRUE(info.has_code);
  EXPECT_TRUE(info.has_data);
  EXPECT_EQ(info.content_identity.size(), 16u);

  // torch.save: the same layout without code.
  const TorchScriptFileInfo saved = read_torchscript_file_info(write(
      "state.pt", make_zip({{"state/data.pkl", "a dict"}, {"state/data/0", "w"}, {"state/version", "3"}})));
  EXPECT_FALSE(saved.has_code);
  EXPECT_TRUE(saved.has_data);
}

TEST_F(TorchScriptFileTest, PrefersTheDataVersionRecord) {
  for (const bool data_version_first : {false, true}) {
    std::vector<Record> records = module_records("net");
    const Record newer = {"net/.data/version", "11\n"};
    records.insert(data_version_first ? records.begin() + 1 : records.end(), newer);
    const TorchScriptFileInfo info = read_torchscript_file_info(write("v.pt", make_zip(records)));
    EXPECT_EQ(info.format_version, 11);
    EXPECT_EQ(info.version_record, "net/.data/version");
  }
  // Entries outside the first entry's folder are not the archive's (as PyTorch reads it).
  std::vector<Record> records = module_records("net");
  records.push_back({"other/.data/version", "99\n"});
  EXPECT_EQ(read_torchscript_file_info(write("outside.pt", make_zip(records))).format_version, 3);
}

// Note [TorchScript identity]
TEST_F(TorchScriptFileTest, IdentityFollowsTheContentOnly) {
  const std::string identity =
      read_torchscript_file_info(write("a.pt", make_zip(module_records("net")))).content_identity;
  // Another top folder (the file saved under another name), another order of the entries,
  // zip64 records and another compression method: the same content.
  std::vector<Record> reordered = module_records("renamed");
  std::swap(reordered[0], reordered[4]);
  reordered[2].method = 0;
  EXPECT_EQ(read_torchscript_file_info(write("b.pt", make_zip(reordered, /*zip64=*/true))).content_identity,
            identity);
  // Other weights, other code, a record more: another content.
  EXPECT_NE(read_torchscript_file_info(write("c.pt", make_zip(module_records("net", "w0w2")))).content_identity,
            identity);
  std::vector<Record> other_code = module_records("net");
  other_code[2].data = "def forward(self, x): return x";
  EXPECT_NE(read_torchscript_file_info(write("d.pt", make_zip(other_code))).content_identity, identity);
  std::vector<Record> more = module_records("net");
  more.push_back({"net/extra/x", ""});
  EXPECT_NE(read_torchscript_file_info(write("e.pt", make_zip(more))).content_identity, identity);
}

TEST_F(TorchScriptFileTest, RefusesWhatIsNoPyTorchArchive) {
  const std::vector<uint8_t> good = make_zip(module_records("net"));
  EXPECT_NE(refusal(dir_ + "/missing.pt").find("cannot open"), std::string::npos);
  EXPECT_NE(refusal(write("short.pt", {'P', 'K'})).find("not a zip archive"), std::string::npos);
  const std::vector<uint8_t> text(4096, 'x');
  EXPECT_NE(refusal(write("text.pt", text)).find("not a zip archive"), std::string::npos);
  // Cut anywhere: the end record is gone, or what it points at is.
  for (const size_t cut : {size_t{1}, size_t{10}, size_t{40}, good.size() / 2}) {
    const std::vector<uint8_t> truncated(good.begin(), good.end() - static_cast<long>(cut));
    refusal(write("truncated.pt", truncated));
  }
  // The end record claims more entries than the directory holds.
  std::vector<uint8_t> more_entries = good;
  more_entries[more_entries.size() - 12] += 1;  // total entries (16 bits at end - 12)
  more_entries[more_entries.size() - 14] += 1;  // entries on this disk
  EXPECT_NE(refusal(write("count.pt", more_entries)).find("central directory"), std::string::npos);
  EXPECT_NE(refusal(write("empty.pt", make_zip({}))).find("empty"), std::string::npos);
  EXPECT_NE(refusal(write("flat.pt", make_zip({{"version", "3"}}))).find("not in a folder"),
            std::string::npos);
  EXPECT_NE(refusal(write("noversion.pt", make_zip({{"net/data.pkl", "x"}}))).find("version record"),
            std::string::npos);
  EXPECT_NE(refusal(write("word.pt", make_zip({{"net/version", "three"}}))).find("decimal"),
            std::string::npos);
  EXPECT_NE(refusal(write("deflated.pt", make_zip({{"net/version", "3", 8}}))).find("compressed"),
            std::string::npos);
}

TEST_F(TorchScriptFileTest, RefusesAnEntryWhoseLocalHeaderIsNotThere) {
  std::vector<uint8_t> bytes = make_zip(module_records("net"));
  bytes[0] = 'X';  // the first local header's signature
  const std::string path = write("local.pt", bytes);
  const std::vector<ZipEntry> entries = read_zip_directory(path);
  try {
    read_zip_member(path, entries.at(0), 1 << 20);
    ADD_FAILURE() << "accepted";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("net/data/0"), std::string::npos) << e.what();
  }
}

}  // namespace
