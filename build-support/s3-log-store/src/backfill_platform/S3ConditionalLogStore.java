package backfill_platform;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.Iterator;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * Delta's commit protocol on S3 for writers on any number of machines.
 *
 * <p>Delta commits version N by creating {@code _delta_log/N.json} only if it does not exist
 * yet; a writer that loses the race must see {@link java.nio.file.FileAlreadyExistsException},
 * re-read the log and retry. Delta's default S3 log store enforces that only inside one JVM,
 * so two machines can both "create" N and one commit silently disappears. S3 conditional
 * writes ({@code If-None-Match: *}), which Hadoop 3.5's S3A exposes as the create option
 * {@code fs.option.create.conditional.overwrite}, make the store itself refuse the second
 * create with 412 Precondition Failed, so the check is atomic across machines and needs no
 * lock service. The commit file is written in one PUT, so a partial file is never visible.
 */
public class S3ConditionalLogStore extends HadoopFileSystemLogStore {
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";

  public S3ConditionalLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf)
      throws IOException {
    FileSystem fs = path.getFileSystem(conf);
    StringBuilder text = new StringBuilder();
    while (actions.hasNext()) {
      text.append(actions.next()).append('\n');
    }
    byte[] bytes = text.toString().getBytes(StandardCharsets.UTF_8);
    if (overwrite) {
      try (OutputStream out = fs.create(path, true)) {
        out.write(bytes);
      }
      return;
    }
    try {
      FSDataOutputStream out =
          (FSDataOutputStream) fs.createFile(path).overwrite(false).must(CONDITIONAL, true).build();
      try {
        out.write(bytes);
      } finally {
        out.close(); // the PUT happens here, and with it the store's check
      }
    } catch (org.apache.hadoop.fs.FileAlreadyExistsException e) {
      throw alreadyExists(path, e);
    } catch (IOException e) {
      if (isPreconditionFailure(e)) {
        throw alreadyExists(path, e);
      }
      throw e;
    }
  }

  private static boolean isPreconditionFailure(Throwable e) {
    for (Throwable t = e; t != null; t = t.getCause()) {
      String message = String.valueOf(t.getMessage());
      if (message.contains("412")
          || message.contains("PreconditionFailed")
          || message.contains("409")
          || message.contains("ConditionalRequestConflict")) {
        return true;
      }
    }
    return false;
  }

  private static java.nio.file.FileAlreadyExistsException alreadyExists(Path path, Throwable e) {
    java.nio.file.FileAlreadyExistsException error =
        new java.nio.file.FileAlreadyExistsException(path.toString());
    error.initCause(e);
    return error;
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false;
  }
}
