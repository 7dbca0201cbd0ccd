package backfill_platform;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system (checksums included), setting permissions through Java's file
 * API instead of a {@code chmod} process.
 *
 * <p>Without Hadoop's native library, which pyspark does not ship, {@link RawLocalFileSystem}
 * runs {@code chmod} for every file and directory it creates: a data file, its checksum
 * file and each partition folder. A run writing a table's 1,096 daily partitions spawned
 * 2,343 processes, about a quarter of that write's time (docs/performance.md). Java sets the
 * same mode bits in the same call ({@code chmod(2)}), without a process.
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-free) layer that {@link LocalFileSystem} wraps. */
  public static class Raw extends RawLocalFileSystem {
    // Bit i of FsPermission.toShort() (others execute first), as in chmod's octal mode.
    private static final PosixFilePermission[] BITS = {
      PosixFilePermission.OTHERS_EXECUTE,
      PosixFilePermission.OTHERS_WRITE,
      PosixFilePermission.OTHERS_READ,
      PosixFilePermission.GROUP_EXECUTE,
      PosixFilePermission.GROUP_WRITE,
      PosixFilePermission.GROUP_READ,
      PosixFilePermission.OWNER_EXECUTE,
      PosixFilePermission.OWNER_WRITE,
      PosixFilePermission.OWNER_READ,
    };

    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      short mode = permission.toShort();
      if ((mode & ~0777) != 0) { // sticky bit: Java's file API cannot set it
        super.setPermission(p, permission);
        return;
      }
      Set<PosixFilePermission> granted = EnumSet.noneOf(PosixFilePermission.class);
      for (int bit = 0; bit < BITS.length; bit++) {
        if ((mode & (1 << bit)) != 0) {
          granted.add(BITS[bit]);
        }
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), granted);
    }
  }
}
